"""Turning page-table rows into the page lists paged kernels take (CSR form: indptr, indices, last_page_len).

The engine's page table maps (request row, position) to a KV slot, ``page * page_size + offset``, and a
request's pages are exactly the slots of its positions 0, page_size, 2 * page_size, ... divided by the page
size. Reading them from the page table, which already lives on the device, costs a few small kernels and no
host loop over every page of every request: at a batch of 256 requests of 1,000 tokens with pages of one
token, building that list in Python would take longer than the attention itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedLayout:
    indptr: torch.Tensor  # [batch + 1] int32, host: request i's pages are indices[indptr[i]:indptr[i+1]]
    indices: torch.Tensor  # [indptr[-1]] int32, on the page table's device
    last_page_len: torch.Tensor  # [batch] int32, host: tokens used in each request's last page


def pages_of(length: int, page_size: int) -> int:
    return -(-length // page_size)


def paged_layout(page_table: torch.Tensor, rows: list[int], kv_lens: list[int], page_size: int) -> PagedLayout:
    """The pages holding positions [0, kv_lens[i]) of page-table row rows[i], for every i."""
    counts = [pages_of(n, page_size) for n in kv_lens]
    indptr = torch.zeros(len(counts) + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor(counts, dtype=torch.int32).cumsum(0)
    last = torch.tensor([n - (c - 1) * page_size for n, c in zip(kv_lens, counts)], dtype=torch.int32)
    total = int(indptr[-1])
    device = page_table.device
    rows_d = torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True)
    counts_d = torch.tensor(counts, dtype=torch.int64).to(device, non_blocking=True)
    starts_d = indptr[:-1].to(torch.int64).to(device, non_blocking=True)
    row_of = torch.repeat_interleave(rows_d, counts_d, output_size=total)
    page_no = torch.arange(total, device=device) - torch.repeat_interleave(starts_d, counts_d, output_size=total)
    slots = page_table[row_of, page_no * page_size]
    return PagedLayout(indptr, (slots // page_size).to(torch.int32), last)
