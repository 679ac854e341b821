"""The paged backend's small decode: captured decode batches of at most ``SMALL_DECODE_MAX_BS`` rows skip
flashinfer altogether, one Triton kernel per layer doing QK-norm, RoPE, the KV write and the attention
(core/kernels/cuda/small_decode.py). The engine's plan turns it on only beside the fused QKV path, which that kernel
starts from, and for a bf16 pool.

Its page lists live in one fixed buffer, ``[indptr | last_page_len | indices]`` (``paging.packed_page_lists``),
filled before a replay by a plain copy instead of a plan: the scheduler packs them as it prepares the batch
(``prepare``), so the replay costs one copy; a batch prepared otherwise (the capture, a size it was not prepared
for) has its lists read from the page table (``fill``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from core.kernels.cuda.attention.flashinfer_common import copy_layout
from core.kernels.cuda.attention.paging import PagedLayout, packed_page_lists
from core.kernels.cuda.small_decode import SMALL_DECODE_MAX_BS, SmallDecodePlan, make_plan
from core.request import Batch
from core.transfer import pinned

# room for SMALL_DECODE_MAX_BS + 1 offsets in each header, and 32 bytes keep the pages 16-byte aligned
SMALL_LISTS_HEADER = 8


@dataclass
class SmallDecodeLists:
    """A decode batch prepared for a small-decode graph: its page lists packed for one copy (pinned host int32),
    and the graph size they were packed for."""

    lists: torch.Tensor
    size: int


@dataclass
class SmallDecodeMetadata:
    """A batch planned for the small decode: the kernel's plan, its buffers filled."""

    plan: SmallDecodePlan


class SmallDecodeGraphs:
    """The small decode's fixed buffers, for captured sizes up to ``min(max_bs, SMALL_DECODE_MAX_BS)``."""

    def __init__(self, max_bs: int, pages_per_row: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 page_size: int, scale: float, pdl: bool, head_block: int, device: torch.device) -> None:
        """``pdl``: the kernel runs as a programmatic dependent launch (KernelChoices.pdl); ``head_block``: the
        pool's layout (KVPool.head_block)."""
        small_bs = min(max_bs, SMALL_DECODE_MAX_BS)
        header = SMALL_LISTS_HEADER
        self.page_size = page_size
        self.device = device
        self.buffer = torch.zeros(2 * header + small_bs * pages_per_row, dtype=torch.int32, device=device)
        self.plan = make_plan(small_bs, num_heads, num_kv_heads, head_dim, page_size, scale, self.buffer[:header],
                              self.buffer[2 * header:], self.buffer[header:2 * header], pdl=pdl,
                              head_block=head_block)

    @staticmethod
    def takes(rows: int) -> bool:
        """Whether a captured decode batch of ``rows`` rows runs the small decode."""
        return 0 < rows <= SMALL_DECODE_MAX_BS

    def prepare(self, batch: Batch, dummy_page: int) -> SmallDecodeLists | None:
        """The batch's page lists packed for its graph, or None where its requests' own lists are not filled in
        (the page table then has its pages)."""
        reqs = batch.reqs
        lists = packed_page_lists([r.pages for r in reqs], [r.device_len for r in reqs], self.page_size,
                                  batch.padded_size - batch.size, dummy_page, SMALL_LISTS_HEADER)
        return None if lists is None else SmallDecodeLists(pinned(lists, self.device), batch.padded_size)

    def fill(self, batch: Batch, layout: Callable[[], PagedLayout]) -> SmallDecodeMetadata:
        """The batch's page lists into the buffers, padded to ``batch.padded_size`` rows: one copy where the batch
        was prepared for this size, else ``layout()``'s lists (capture, tests, or pages only the page table
        has)."""
        meta, plan = batch.attn_metadata, self.plan
        if isinstance(meta, SmallDecodeLists) and meta.size == batch.padded_size:
            self.buffer[:len(meta.lists)].copy_(meta.lists, non_blocking=True)
        else:
            copy_layout(layout(), plan.kv_indptr, plan.kv_indices, plan.kv_last)
        return SmallDecodeMetadata(plan)
