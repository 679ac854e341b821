"""The Triton kernel behind core/kernels/cuda/fused_qkv.py, and the per-head QK-norm + RoPE it shares with the
small-decode kernel (core/kernels/cuda/small_decode_triton.py).

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
def kv_head_offset(slot, kv_head, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_BLOCK: tl.constexpr):
    """Where KV head ``kv_head`` of the token in ``slot`` starts in a layer of the pool (broadcasting): token-major
    with HEAD_BLOCK 1, head-major with HEAD_BLOCK the page size (core/kvcache/pool.py's formula)."""
    return ((slot // HEAD_BLOCK) * (NUM_KV_HEADS * HEAD_BLOCK * HEAD_DIM) + kv_head * (HEAD_BLOCK * HEAD_DIM)
            + (slot % HEAD_BLOCK) * HEAD_DIM)


@triton.jit
def store_heads(cache_ptr, scale_ptr, slot, kv_heads, valid, x, FP8: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                HEAD_DIM: tl.constexpr, HEAD_BLOCK: tl.constexpr):
    """Heads ``kv_heads`` ([rows], ``valid`` where real) of one token, ``x`` [rows, HEAD_DIM], into its slot; for
    an fp8 pool (token-major) as e4m3 with a scale per head, the way core/kvcache/pool.py's quantize_fp8 does it:
    divided by its largest magnitude over 448."""
    d = tl.arange(0, HEAD_DIM)
    dst = cache_ptr + kv_head_offset(slot, kv_heads, NUM_KV_HEADS, HEAD_DIM, HEAD_BLOCK)[:, None] + d[None, :]
    if FP8:
        x32 = x.to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x32), axis=1) / 448.0, 1.1754943508222875e-38)  # float32's tiny
        tl.store(dst, (x32 / scale[:, None]).to(tl.float8e4nv), mask=valid[:, None])
        tl.store(scale_ptr + slot * NUM_KV_HEADS + kv_heads, scale, mask=valid)
    else:
        tl.store(dst, x, mask=valid[:, None])


# positions and KV slots are slices of the step's one upload, at any offset: specialising on their alignment
# would compile a new variant in the middle of a run
@triton.jit(do_not_specialize_on_alignment=["positions_ptr", "loc_ptr"])
def qkv_norm_rope_store_kernel(qkv_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
                               positions_ptr, loc_ptr, cos_sin_ptr, q_weight_ptr, k_weight_ptr, eps,
                               qkv_row_stride, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                               HEAD_DIM: tl.constexpr, NORM: tl.constexpr, FP8: tl.constexpr,
                               BLOCK_H: tl.constexpr, HEAD_BLOCK: tl.constexpr):
    """One program per (token, part), each part's heads at once ([BLOCK_H, HEAD_DIM], padded rows masked):
    part 0 the query heads to the contiguous q, part 1 the key heads into the token's KV slot, both normalised
    and rotated, part 2 the value heads copied into the slot (with FP8, k and v quantised with their scales).
    (A program per (token, head) made 32 tiny programs a token, bound by starting programs.)"""
    token = tl.program_id(0)
    part = tl.program_id(1)
    HALF: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, HEAD_DIM)
    h = tl.arange(0, BLOCK_H)
    row = qkv_ptr + token * qkv_row_stride
    slot = tl.load(loc_ptr + token).to(tl.int64)
    kv_valid = h < NUM_KV_HEADS
    if part == 2:  # the value heads: copied into the slot
        v = tl.load(row + (NUM_HEADS + NUM_KV_HEADS + h)[:, None] * HEAD_DIM + d[None, :], mask=kv_valid[:, None],
                    other=0.0)
        store_heads(v_cache_ptr, v_scale_ptr, slot, h, kv_valid, v, FP8, NUM_KV_HEADS, HEAD_DIM, HEAD_BLOCK)
    else:
        position = tl.load(positions_ptr + token).to(tl.int64)
        cos = tl.load(cos_sin_ptr + position * HEAD_DIM + d % HALF)
        sin = tl.load(cos_sin_ptr + position * HEAD_DIM + HALF + d % HALF)
        if part == 0:
            q_valid = h < NUM_HEADS
            q = norm_rope(row, h, q_valid, q_weight_ptr, eps, cos, sin, NORM, HEAD_DIM)
            tl.store(q_out_ptr + (token * NUM_HEADS + h)[:, None] * HEAD_DIM + d[None, :], q, mask=q_valid[:, None])
        else:
            k = norm_rope(row, NUM_HEADS + h, kv_valid, k_weight_ptr, eps, cos, sin, NORM, HEAD_DIM)
            store_heads(k_cache_ptr, k_scale_ptr, slot, h, kv_valid, k, FP8, NUM_KV_HEADS, HEAD_DIM, HEAD_BLOCK)
