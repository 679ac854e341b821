"""One kernel from the QKV projection's output to attention's inputs: QK-norm, RoPE and the KV-cache write.

Unfused, every layer runs a norm for q, a norm for k, a RoPE kernel, a scatter for k, a scatter for v and a
copy making q contiguous: six launches of a few microseconds each, 168 per decode step of a 28-layer model,
which is most of what a batch-1 step costs beyond reading the weights. Here one Triton program handles one
(token, head): a query head is normalised, rotated and written to a contiguous q; a key head is normalised,
rotated and written straight into its KV-pool slot; a value head is copied into its slot.

The arithmetic follows the separate kernels: the norm in float32, its result rounded to the model's dtype,
rotated in float32 (neox halves, cos/sin from the same table), rounded once more on the way out.
Triton is imported lazily (core/layers/triton_support.py says whether it can run).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class QKVSpec:
    """What turns one layer's QKV projection output into attention's inputs."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    cos_sin: torch.Tensor  # [positions, head_dim]: cos for the first half, sin for the second
    q_norm_weight: torch.Tensor | None  # per-head RMSNorm gains (Qwen3), or None
    k_norm_weight: torch.Tensor | None
    eps: float


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    # positions and KV slots are slices of the step's one upload, at any offset: specialising on their
    # alignment would compile a new variant in the middle of a run
    @triton.jit(do_not_specialize_on_alignment=["positions_ptr", "loc_ptr"])
    def qkv_norm_rope_store(qkv_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, positions_ptr, loc_ptr, cos_sin_ptr,
                            q_weight_ptr, k_weight_ptr, eps, qkv_row_stride,
                            NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                            NORM: tl.constexpr):
        token = tl.program_id(0)
        head = tl.program_id(1)
        HALF: tl.constexpr = HEAD_DIM // 2
        offs = tl.arange(0, HALF)
        src = qkv_ptr + token * qkv_row_stride + head * HEAD_DIM
        x1 = tl.load(src + offs)
        x2 = tl.load(src + HALF + offs)
        slot = tl.load(loc_ptr + token).to(tl.int64)
        slot_base = slot * (NUM_KV_HEADS * HEAD_DIM)
        if head >= NUM_HEADS + NUM_KV_HEADS:  # a value head: copied into its slot
            dst = v_cache_ptr + slot_base + (head - NUM_HEADS - NUM_KV_HEADS) * HEAD_DIM
            tl.store(dst + offs, x1)
            tl.store(dst + HALF + offs, x2)
        else:
            is_query = head < NUM_HEADS
            a = x1.to(tl.float32)
            b = x2.to(tl.float32)
            if NORM:
                if is_query:
                    w1 = tl.load(q_weight_ptr + offs).to(tl.float32)
                    w2 = tl.load(q_weight_ptr + HALF + offs).to(tl.float32)
                else:
                    w1 = tl.load(k_weight_ptr + offs).to(tl.float32)
                    w2 = tl.load(k_weight_ptr + HALF + offs).to(tl.float32)
                mean_square = (tl.sum(a * a, axis=0) + tl.sum(b * b, axis=0)) / HEAD_DIM
                inv = 1.0 / tl.sqrt(mean_square + eps)
                a = (a * inv * w1).to(x1.dtype).to(tl.float32)
                b = (b * inv * w2).to(x2.dtype).to(tl.float32)
            position = tl.load(positions_ptr + token).to(tl.int64)
            cos = tl.load(cos_sin_ptr + position * HEAD_DIM + offs)
            sin = tl.load(cos_sin_ptr + position * HEAD_DIM + HALF + offs)
            r1 = (a * cos - b * sin).to(x1.dtype)
            r2 = (b * cos + a * sin).to(x2.dtype)
            if is_query:
                q_dst = q_out_ptr + (token * NUM_HEADS + head) * HEAD_DIM
                tl.store(q_dst + offs, r1)
                tl.store(q_dst + HALF + offs, r2)
            else:
                k_dst = k_cache_ptr + slot_base + (head - NUM_HEADS) * HEAD_DIM
                tl.store(k_dst + offs, r1)
                tl.store(k_dst + HALF + offs, r2)

    return qkv_norm_rope_store


def qkv_norm_rope_store(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                        positions: torch.Tensor, cos_sin: torch.Tensor, q_weight: torch.Tensor | None,
                        k_weight: torch.Tensor | None, eps: float, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        out_loc: torch.Tensor) -> torch.Tensor:
    """qkv: [tokens, (heads + 2 * kv_heads) * head_dim]; k_cache, v_cache: one layer's [slots, kv_heads, head_dim].
    Writes k and v at ``out_loc`` and returns q as a new contiguous [tokens, heads, head_dim]."""
    tokens = qkv.shape[0]
    q = torch.empty(tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if tokens == 0:
        return q
    norm = q_weight is not None
    weight = q_weight if norm else cos_sin  # an unused pointer when there is no QK-norm
    _kernel()[(tokens, num_heads + 2 * num_kv_heads)](
        qkv, q, k_cache, v_cache, positions, out_loc, cos_sin, weight, k_weight if norm else weight, eps,
        qkv.stride(0), NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, NORM=norm, num_warps=1)
    return q
