"""Paged decode attention as one Triton kernel, for bf16 pages and for the fp8 pool (core/kvcache/pool.py).

flashinfer's paged decode runs no faster on fp8 pages than on bf16 ones at the benchmark's shape (it moves
fp8 bytes at half bf16's rate), so halving the bytes gained nothing there. This kernel
reads each page once per (request, KV head, split) program, the whole query group against each tile of cached
tokens, and folds the per-(slot, head) fp8 scales into the two products instead of dequantising the tiles.
The page lists are flashinfer's CSR form (core/kernels/cuda/attention/paging.py). Where nvcc builds it, an fp8 pool's
decode runs the CUDA kernel instead (core/kernels/cuda/fp8_decode.py, the faster of the two).

A request's cached tokens can be split over several programs (``DecodeTile.splits``): each writes a partial
result and its log-sum-exp, and the last to finish merges them (a per-(request, KV head) counter that the
merging program resets), so a batch of few rows still keeps every SM reading.

On fp8 pages that per-head kernel is bound by work per cached token, not by bytes (ncu: the 2 real query rows of a
group padded to the 16 rows a tensor-core product needs, so softmax and bookkeeping on 16 rows for 2, and 128-byte
loads per head). Hence a second variant, ``DecodeTile.all_heads`` (core/kernels/cuda/paged_decode_rows_triton.py): one
program per (request, split) loads whole token rows (a page's K for all heads is one contiguous block) and multiplies
a query holding every head (block-diagonal over whole rows, or with ``head_dots`` a product per KV head with its query
group on the product's narrow side), so the softmax runs on real rows only and the loads are few and large; its splits
count on one counter per request. (Multiplying the 2 real rows on the CUDA cores instead, as sums of products in
Triton, was measured slower; docs/BENCHMARKS.md.)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from core.arith import next_pow2
from core.kernels.cuda.small_decode import block_g
from core.kvcache.pool import KVPool


@dataclass(frozen=True)
class DecodeTile:
    """How the kernel walks the cached tokens: tokens per loop iteration, warps and pipeline stages per
    program, programs per (request, KV head), whether fp8 pages are multiplied in float16, and a cap on
    registers per thread (None: the compiler's choice), which sets how many programs an SM holds at once.
    ``all_heads`` picks the variant with one program per (request, split) over whole token rows (the module's
    docstring says why); its ``splits`` are then programs per request, and ``head_dots`` batches its products
    per KV head (3-D dots) instead of one block-diagonal product over whole rows."""

    tokens: int
    warps: int
    stages: int
    splits: int = 1
    f16: bool = False
    max_registers: int | None = None
    all_heads: bool = False
    head_dots: bool = False


# fp8: the best of a sweep at 64 and 256 rows (docs/BENCHMARKS.md); the register cap lets an SM hold more programs
TILES = {False: DecodeTile(64, 4, 2), True: DecodeTile(64, 4, 2, f16=True, max_registers=128)}
# the all-heads variant on fp8 pages, a page of tokens per iteration, products per KV head. Faster than TILES[True]
# as a kernel at large batches, yet not the default: the engine's fp8 run with it was slower end to end, in
# throughput and at batch 1 (docs/BENCHMARKS.md).
# ``TILES[True] = ALL_HEADS_TILE`` makes the engine's fp8 decode run it, under CUDA graphs too.
ALL_HEADS_TILE = DecodeTile(16, 4, 2, f16=True, all_heads=True, head_dots=True)


def block_h(num_heads: int) -> int:
    """The all-heads variant's query rows: every head, padded to a power of two of at least 16 (a tensor-core
    product's rows)."""
    return max(16, next_pow2(num_heads))


@dataclass
class SplitBuffers:
    """Partial results of split programs, sized for up to ``rows`` requests of ``max_splits`` splits; the
    counters are zero between launches (the merging program resets its own). Either variant fits: the
    per-head one takes kv_heads * block_g rows per (request, split) and a counter per (request, KV head), the
    all-heads one block_h rows (head dots: a row per padded KV head and group slot) and a counter per request."""

    part_o: torch.Tensor  # [rows * max_splits * rows_per_split, head_dim] float32
    part_lse: torch.Tensor  # [rows * max_splits * rows_per_split] float32
    counters: torch.Tensor  # [rows * kv_heads] int32
    max_splits: int

    @classmethod
    def make(cls, rows: int, num_heads: int, num_kv_heads: int, head_dim: int, max_splits: int,
             device: torch.device) -> "SplitBuffers":
        group_slots = next_pow2(num_kv_heads) * next_pow2(num_heads // num_kv_heads)  # the all-heads head-dots rows
        rows_per_split = max(num_kv_heads * block_g(num_heads, num_kv_heads), block_h(num_heads), group_slots)
        parts = rows * max_splits * rows_per_split
        return cls(torch.empty(parts, head_dim, dtype=torch.float32, device=device),
                   torch.empty(parts, dtype=torch.float32, device=device),
                   torch.zeros(rows * num_kv_heads, dtype=torch.int32, device=device), max_splits)


@dataclass
class PagedDecodeArgs:
    """One step's inputs to the paged decode besides q: the page lists on the device, and the tile and split
    buffers (None: TILES' default, buffers made on the spot), as an attention backend keeps them per step.
    ``cuda``: an fp8 pool is read by the CUDA kernel (core/kernels/cuda/fp8_decode.py) with the tile's splits,
    not by Triton's."""

    kv_indptr: torch.Tensor  # [batch + 1] int32
    kv_indices: torch.Tensor  # int32 pages
    kv_last: torch.Tensor  # [batch] int32
    tile: DecodeTile | None = None
    split_buffers: SplitBuffers | None = None
    cuda: bool = False

    def attend(self, q: torch.Tensor, pool: KVPool, layer: int, scale: float) -> torch.Tensor:
        if self.cuda:
            from core.kernels.cuda.fp8_decode import fp8_decode_cuda

            splits = self.tile.splits if self.tile else 1
            buffers = self.split_buffers
            return fp8_decode_cuda(q, pool, layer, self.kv_indptr, self.kv_indices, self.kv_last, scale,
                                   splits=splits, part_o=buffers.part_o if buffers else None,
                                   part_lse=buffers.part_lse if buffers else None)
        return paged_decode(q, pool, layer, self.kv_indptr, self.kv_indices, self.kv_last, scale, tile=self.tile,
                            split_buffers=self.split_buffers)


@functools.cache
def _kernel(all_heads: bool, head_dots: bool):
    if all_heads:  # imports triton
        from core.kernels.cuda.paged_decode_rows_triton import paged_decode_head_dots_kernel, paged_decode_rows_kernel

        return paged_decode_head_dots_kernel if head_dots else paged_decode_rows_kernel
    from core.kernels.cuda.paged_decode_triton import paged_decode_kernel  # imports triton

    return paged_decode_kernel


def paged_decode(q: torch.Tensor, pool: KVPool, layer: int, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                 kv_last: torch.Tensor, scale: float, out: torch.Tensor | None = None,
                 tile: DecodeTile | None = None, split_buffers: SplitBuffers | None = None) -> torch.Tensor:
    """q: [batch, heads, head_dim], one query per request; the pages of request i are
    ``kv_indices[kv_indptr[i]:kv_indptr[i + 1]]`` (int32, on the device), its last holding ``kv_last[i]``
    tokens. Returns [batch, heads, head_dim] in q's dtype. ``tile`` defaults to TILES' entry for the pool's
    dtype (``tile.all_heads``: the variant of one program per request and split); a tile of several splits
    takes ``split_buffers`` (made here when not given: not under a graph)."""
    tile = tile or TILES[pool.fp8]
    batch, num_heads, head_dim = q.shape
    k_cache, v_cache = pool.k[layer], pool.v[layer]
    num_kv_heads = k_cache.shape[1]
    out = torch.empty_like(q) if out is None else out
    k_scale = pool.k_scale[layer] if pool.fp8 else k_cache  # any valid pointer when unused
    v_scale = pool.v_scale[layer] if pool.fp8 else v_cache
    if tile.splits > 1:
        if split_buffers is None:
            split_buffers = SplitBuffers.make(batch, num_heads, num_kv_heads, head_dim, tile.splits, q.device)
        assert tile.splits <= split_buffers.max_splits and len(split_buffers.counters) >= batch * num_kv_heads
        parts = (split_buffers.part_o, split_buffers.part_lse, split_buffers.counters)
    else:
        parts = (out, out, kv_last)  # unused pointers
    f16 = tile.f16 and pool.fp8 and q.dtype != torch.float32
    common = dict(NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, PAGE_SIZE=pool.page_size,
                  GROUP=num_heads // num_kv_heads, BLOCK_T=tile.tokens, SPLITS=tile.splits, FP8=pool.fp8, F16=f16,
                  DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=tile.warps,
                  num_stages=tile.stages, **({"maxnreg": tile.max_registers} if tile.max_registers else {}))
    if tile.all_heads:
        grid = (batch, tile.splits)  # a row of every KV head's values: head_dim a power of two, heads padded
        block_kv = next_pow2(num_kv_heads)
        if tile.head_dots:
            shape = dict(BLOCK_KV=block_kv, BLOCK_G=next_pow2(num_heads // num_kv_heads))
        else:
            shape = dict(BLOCK_H=block_h(num_heads), BLOCK_ROW=head_dim * block_kv)
    else:
        grid = (batch, num_kv_heads, tile.splits)
        shape = dict(BLOCK_G=block_g(num_heads, num_kv_heads))
    kernel = _kernel(tile.all_heads, tile.head_dots)
    kernel[grid](q.contiguous(), k_cache, v_cache, k_scale, v_scale, kv_indptr, kv_indices, kv_last, *parts, out,
                 scale, **common, **shape)
    return out
