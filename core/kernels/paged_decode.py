"""Paged decode attention as one Triton kernel, for bf16 pages and for the fp8 pool (core/kvcache/pool.py).

flashinfer's paged decode runs no faster on fp8 pages than on bf16 ones at the benchmark's shape (measured on
an H200: it moves bf16 at 4.0 TB/s and fp8 at 2.0), so halving the bytes gained nothing there. This kernel
reads each page once per (request, KV head) program, the whole query group against each tile of cached
tokens, and folds the per-(slot, head) fp8 scales into the two products instead of dequantising the tiles.
The page lists are flashinfer's CSR form (core/attention/paging.py).
"""

from __future__ import annotations

import functools

import torch

from core.kernels.small_decode import block_g
from core.kvcache.pool import KVPool

# (cached tokens per loop iteration, warps, pipeline stages), for bf16 pages and for fp8 ones
TILES = {False: (64, 4, 2), True: (128, 4, 2)}  # fp8: the sweep in scripts/gpu_fp8_decode.py


@functools.cache
def _kernel():
    from core.kernels.paged_decode_triton import paged_decode_kernel  # imports triton

    return paged_decode_kernel


def paged_decode(q: torch.Tensor, pool: KVPool, layer: int, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                 kv_last: torch.Tensor, scale: float, out: torch.Tensor | None = None,
                 tile: tuple[int, int, int] | None = None) -> torch.Tensor:
    """q: [batch, heads, head_dim], one query per request; the pages of request i are
    ``kv_indices[kv_indptr[i]:kv_indptr[i + 1]]`` (int32, on the device), its last holding ``kv_last[i]``
    tokens. Returns [batch, heads, head_dim] in q's dtype. ``tile``: (tokens per iteration, warps, stages),
    default TILES' entry for the pool's dtype."""
    block_t, warps, stages = tile or TILES[pool.fp8]
    batch, num_heads, head_dim = q.shape
    k_cache, v_cache = pool.k[layer], pool.v[layer]
    num_kv_heads = k_cache.shape[1]
    out = torch.empty_like(q) if out is None else out
    k_scale = pool.k_scale[layer] if pool.fp8 else k_cache  # any valid pointer when unused
    v_scale = pool.v_scale[layer] if pool.fp8 else v_cache
    _kernel()[(batch, num_kv_heads)](
        q.contiguous(), k_cache, v_cache, k_scale, v_scale, kv_indptr, kv_indices, kv_last, out, scale,
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, PAGE_SIZE=pool.page_size,
        GROUP=num_heads // num_kv_heads, BLOCK_G=block_g(num_heads, num_kv_heads), BLOCK_T=block_t,
        FP8=pool.fp8, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=warps,
        num_stages=stages)
    return out
