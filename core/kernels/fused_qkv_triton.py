"""The Triton kernel behind core/kernels/fused_qkv.py, and the per-head QK-norm + RoPE it shares with the
small-decode kernel (core/kernels/small_decode_triton.py).

A module of its own because it imports triton at the top: Triton resolves the helpers a kernel calls among
its module's globals, and the rest of the engine must import without triton installed.
"""

import triton
import triton.language as tl


@triton.jit
def norm_rope(qkv_row, heads, valid, gain_ptr, eps, cos, sin, NORM: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Heads ``heads`` ([rows]) of one token's QKV row, RMS-normalised (optional) and rotated (neox halves), in
    float32 after rounding to the model's dtype at the points the separate kernels round."""
    HALF: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, HEAD_DIM)
    partner = (d + HALF) % HEAD_DIM  # rotate_half(x)[d] = -x[d + half] for d < half, x[d - half] after
    x = tl.load(qkv_row + heads[:, None] * HEAD_DIM + d[None, :], mask=valid[:, None], other=0.0)
    dtype = x.dtype
    x = x.to(tl.float32)
    x_partner = tl.load(qkv_row + heads[:, None] * HEAD_DIM + partner[None, :], mask=valid[:, None],
                        other=0.0).to(tl.float32)
    if NORM:
        inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)
        x = (x * inv_rms[:, None] * tl.load(gain_ptr + d).to(tl.float32)[None, :]).to(dtype).to(tl.float32)
        x_partner = (x_partner * inv_rms[:, None] * tl.load(gain_ptr + partner).to(tl.float32)[None, :])
        x_partner = x_partner.to(dtype).to(tl.float32)
    sign = tl.where(d < HALF, -1.0, 1.0)
    return (x * cos[None, :] + sign[None, :] * x_partner * sin[None, :]).to(dtype)


@triton.jit
def store_head(cache_ptr, scale_ptr, slot, kv_head, x, FP8: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
               HEAD_DIM: tl.constexpr):
    """One head's vector ([1, HEAD_DIM]) into its slot; for an fp8 pool as e4m3 with its scale, the way
    core/kvcache/pool.py's quantize_fp8 does it: divided by its largest magnitude over 448."""
    d = tl.arange(0, HEAD_DIM)
    dst = cache_ptr + slot * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM + d[None, :]
    if FP8:
        x32 = x.to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x32), axis=1) / 448.0, 1.1754943508222875e-38)  # float32's tiny
        tl.store(dst, (x32 / scale[:, None]).to(tl.float8e4nv))
        tl.store(scale_ptr + slot * NUM_KV_HEADS + kv_head + tl.arange(0, 1), scale)
    else:
        tl.store(dst, x)


# positions and KV slots are slices of the step's one upload, at any offset: specialising on their alignment
# would compile a new variant in the middle of a run
@triton.jit(do_not_specialize_on_alignment=["positions_ptr", "loc_ptr"])
def qkv_norm_rope_store_kernel(qkv_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
                               positions_ptr, loc_ptr, cos_sin_ptr, q_weight_ptr, k_weight_ptr, eps,
                               qkv_row_stride, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                               HEAD_DIM: tl.constexpr, NORM: tl.constexpr, FP8: tl.constexpr):
    """One program per (token, head): a query head to the contiguous q, a key head into its KV slot, both
    normalised and rotated; a value head copied into its slot (with FP8, both quantised with their scales)."""
    token = tl.program_id(0)
    head = tl.program_id(1)
    HALF: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, HEAD_DIM)
    row = qkv_ptr + token * qkv_row_stride
    slot = tl.load(loc_ptr + token).to(tl.int64)
    if head >= NUM_HEADS + NUM_KV_HEADS:  # a value head: copied into its slot
        kv_head = head - NUM_HEADS - NUM_KV_HEADS
        v = tl.load(row + head * HEAD_DIM + d[None, :])
        store_head(v_cache_ptr, v_scale_ptr, slot, kv_head, v, FP8, NUM_KV_HEADS, HEAD_DIM)
    else:
        position = tl.load(positions_ptr + token).to(tl.int64)
        cos = tl.load(cos_sin_ptr + position * HEAD_DIM + d % HALF)
        sin = tl.load(cos_sin_ptr + position * HEAD_DIM + HALF + d % HALF)
        one = tl.arange(0, 1)
        if head < NUM_HEADS:
            q = norm_rope(row, head + one, one < 1, q_weight_ptr, eps, cos, sin, NORM, HEAD_DIM)
            tl.store(q_out_ptr + (token * NUM_HEADS + head) * HEAD_DIM + d[None, :], q)
        else:
            k = norm_rope(row, head + one, one < 1, k_weight_ptr, eps, cos, sin, NORM, HEAD_DIM)
            store_head(k_cache_ptr, k_scale_ptr, slot, head - NUM_HEADS, k, FP8, NUM_KV_HEADS, HEAD_DIM)
