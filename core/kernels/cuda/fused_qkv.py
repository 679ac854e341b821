"""One kernel from the QKV projection's output to attention's inputs: QK-norm, RoPE and the KV-cache write.

Unfused, every layer runs a norm for q, a norm for k, a RoPE kernel, a scatter for k, a scatter for v and a
copy making q contiguous: six launches of a few microseconds each, 168 per decode step of a 28-layer model,
which is most of what a batch-1 step costs beyond reading the weights. Here one Triton program handles one
(token, head): a query head is normalised, rotated and written to a contiguous q; a key head is normalised,
rotated and written straight into its KV-pool slot; a value head is copied into its slot.

The arithmetic follows the separate kernels: the norm in float32, its result rounded to the model's dtype,
rotated in float32 (neox halves, cos/sin from the same table), rounded once more on the way out.
Triton is imported lazily (core/kernels/cuda/triton_available.py says whether it can run).
"""

from __future__ import annotations

import functools

import torch

from core.arith import next_pow2


@functools.cache
def _kernel():
    from core.kernels.cuda.fused_qkv_triton import qkv_norm_rope_store_kernel  # imports triton

    return qkv_norm_rope_store_kernel


def qkv_norm_rope_store(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                        positions: torch.Tensor, cos_sin: torch.Tensor, q_weight: torch.Tensor | None,
                        k_weight: torch.Tensor | None, eps: float, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        out_loc: torch.Tensor, k_scale: torch.Tensor | None = None,
                        v_scale: torch.Tensor | None = None, head_block: int = 1,
                        num_warps: int | None = None) -> torch.Tensor:
    """qkv: [tokens, (heads + 2 * kv_heads) * head_dim]; k_cache, v_cache: one layer of the pool, token-major
    ([slots, kv_heads, head_dim]) or head-major with ``head_block`` its page size (KVPool.head_block). Writes k and
    v at ``out_loc`` and returns q as a new contiguous [tokens, heads, head_dim]. With an fp8 pool's layer (e4m3
    caches and their [slots, kv_heads] float32 ``k_scale``/``v_scale``) k and v are quantised on the way in, as
    core/kvcache/pool.py's store does. ``num_warps``: the program's warps, by default by the block's size
    (other counts measured no better: docs/BENCHMARKS.md)."""
    tokens = qkv.shape[0]
    q = torch.empty(tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if tokens == 0:
        return q
    norm = q_weight is not None
    weight = q_weight if norm else cos_sin  # an unused pointer when there is no QK-norm
    fp8 = k_scale is not None
    block_h = next_pow2(max(num_heads, num_kv_heads))
    _kernel()[(tokens, 3)](  # per token: its query heads, its key heads, its value heads
        qkv, q, k_cache, v_cache, k_scale if fp8 else cos_sin, v_scale if fp8 else cos_sin, positions, out_loc,
        cos_sin, weight, k_weight if norm else weight, eps, qkv.stride(0), NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, NORM=norm, FP8=fp8, BLOCK_H=block_h, HEAD_BLOCK=head_block,
        num_warps=num_warps or (4 if block_h * head_dim >= 1024 else 1))
    return q
