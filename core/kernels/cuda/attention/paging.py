"""Turning page-table rows into the page lists paged kernels take (CSR form: indptr, indices, last_page_len).

The engine's page table maps (request row, position) to a KV slot, ``page * page_size + offset``, and a
request's pages are exactly the slots of its positions 0, page_size, 2 * page_size, ... divided by the page
size. Reading them from the page table, which already lives on the device, costs a few small kernels and no
host loop over every page of every request: at a batch of 256 requests of 1,000 tokens with pages of one
token, building that list in Python would take longer than the attention itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate, chain

import torch

from core.arith import pages_for
from core.transfer import host_tensor, upload, upload_list


@dataclass
class PagedLayout:
    indptr: torch.Tensor  # [batch + 1] int32, host: request i's pages are indices[indptr[i]:indptr[i+1]]
    indices: torch.Tensor  # [indptr[-1]] int32, on the page table's device
    last_page_len: torch.Tensor  # [batch] int32, host: tokens used in each request's last page

    @property
    def size(self) -> int:
        return len(self.last_page_len)

    def padded(self, pad: int, dummy_page: int) -> "PagedLayout":
        """``pad`` more rows, each one token long in ``dummy_page`` (the padding rows of a CUDA-graph batch)."""
        if pad <= 0:
            return self
        total = int(self.indptr[-1])
        indptr = torch.cat([self.indptr, total + torch.arange(1, pad + 1, dtype=torch.int32)])
        filler = torch.full((pad,), dummy_page, dtype=torch.int32, device=self.indices.device)
        return PagedLayout(indptr, torch.cat([self.indices, filler]),
                           torch.cat([self.last_page_len, torch.ones(pad, dtype=torch.int32)]))


HOST_PAGE_LIST_MAX = 8192  # longer page lists are gathered on the device


def _page_counts(kv_lens: list[int], page_size: int) -> list[int]:
    return [pages_for(n, page_size) for n in kv_lens]


def _host_lists(pages: list[list[int]], kv_lens: list[int], counts: list[int], page_size: int, pad: int,
                dummy_page: int) -> tuple[list[int], list[int], list[int]] | None:
    """(indptr, last_page_len, indices) as Python lists from the requests' own page lists (``counts[i]`` pages of
    request i), then ``pad`` padding rows of one token in ``dummy_page``; None when some request's own list is not
    filled in (the page table has its pages)."""
    flat = list(chain.from_iterable(own if len(own) == count else own[:count] for own, count in zip(pages, counts)))
    total = sum(counts)
    if len(flat) != total:
        return None
    indptr = [0, *accumulate(counts), *range(total + 1, total + pad + 1)]
    last = [n - (count - 1) * page_size for n, count in zip(kv_lens, counts)] + [1] * pad
    return indptr, last, flat + [dummy_page] * pad


def paged_layout(page_table: torch.Tensor, rows: list[int], kv_lens: list[int], page_size: int,
                 pages: list[list[int]] | None = None, pad: int = 0, dummy_page: int = 0) -> PagedLayout:
    """The pages holding positions [0, kv_lens[i]) of page-table row rows[i], for every i, then ``pad`` padding
    rows of one token in ``dummy_page`` (``PagedLayout.padded``).

    Short lists (given the requests' own page lists, ``pages``) are flattened on the host and sent in one
    upload: one copy instead of a dozen small kernels, which matters when a step is a millisecond; the
    flattening is host time that grows with the pages, so only short lists take this path. Otherwise
    the host sends one small tensor (each row and its page count) and the page list is gathered from the page
    table on the device, whatever its length, with no host sync.
    """
    device = page_table.device
    counts = _page_counts(kv_lens, page_size)
    total = sum(counts)
    lists = (_host_lists(pages, kv_lens, counts, page_size, pad, dummy_page)
             if pages is not None and total + pad <= HOST_PAGE_LIST_MAX else None)
    if lists is not None:
        indptr, last, flat = lists
        return PagedLayout(host_tensor(indptr, torch.int32), upload_list(flat, torch.int32, device),
                           host_tensor(last, torch.int32))
    layout = PagedLayout(host_tensor([0, *accumulate(counts)], torch.int32),
                         torch.zeros(0, dtype=torch.int32, device=device),
                         host_tensor([n - (count - 1) * page_size for n, count in zip(kv_lens, counts)], torch.int32))
    if total:
        per_row = upload(host_tensor([*rows, *counts], torch.int64), device).view(2, -1)
        rows_d, counts_d = per_row[0], per_row[1]
        starts_d = torch.cumsum(counts_d, 0) - counts_d
        row_of = torch.repeat_interleave(rows_d, counts_d, output_size=total)
        page_no = torch.arange(total, device=device) - torch.repeat_interleave(starts_d, counts_d, output_size=total)
        slots = page_table[row_of, page_no * page_size]
        layout.indices = torch.div(slots, page_size, rounding_mode="floor").to(torch.int32)
    return layout.padded(pad, dummy_page)


def packed_page_lists(pages: list[list[int]], kv_lens: list[int], page_size: int, pad: int, dummy_page: int,
                      header: int) -> torch.Tensor | None:
    """A few requests' page lists as one host int32 tensor, ``[indptr | last_page_len | indices]`` with the first
    two each padded to ``header`` entries, so that one copy fills a kernel's fixed buffers whatever the batch
    size; plus ``pad`` padding rows of one token in ``dummy_page``. None when some request's own list is not
    filled in (``paged_layout`` then reads the page table)."""
    if len(kv_lens) + pad + 1 > header:
        return None
    lists = _host_lists(pages, kv_lens, _page_counts(kv_lens, page_size), page_size, pad, dummy_page)
    if lists is None:
        return None
    indptr, last, flat = lists
    return host_tensor(indptr + [0] * (header - len(indptr)) + last + [0] * (header - len(last)) + flat, torch.int32)
