"""The Triton kernel behind core/kernels/cuda/paged_decode.py (see there for what it does and why).

A module of its own because it imports triton at the top; the rest of the engine imports without triton.
"""

import triton
import triton.language as tl

from core.kernels.cuda.split_merge_triton import finish_split, softmax_step, split_start, tile_slots


@triton.jit
def paged_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, kv_indptr_ptr, kv_indices_ptr,
                        kv_last_ptr, part_o_ptr, part_lse_ptr, counter_ptr, out_ptr, sm_scale,
                        NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                        PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                        BLOCK_T: tl.constexpr, SPLITS: tl.constexpr, FP8: tl.constexpr, F16: tl.constexpr,
                        DOT_PRECISION: tl.constexpr):
    """One program per (request, KV head, split of the cached tokens): the group's query heads against the
    split's tiles of cached tokens, online softmax; with more than one split the last one to finish merges.

    With FP8 the pages hold e4m3 values and a float32 scale per (slot, KV head): the scales come out of the
    products (q . k = k_scale * (q . k8), and p @ v = (p * v_scale) @ v8), so the loop converts the fp8 tiles
    to the product's dtype and multiplies a row of scales, never a whole tile. F16 makes that dtype float16
    (e4m3 to float16 is one instruction per two values on GPUs that have fp8; to bfloat16 it is several)."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    KV_ROW: tl.constexpr = NUM_KV_HEADS * HEAD_DIM
    d = tl.arange(0, HEAD_DIM)
    g = tl.arange(0, BLOCK_G)
    g_valid = g < GROUP
    heads = kv_head * GROUP + g
    q_offs = (b * NUM_HEADS + heads)[:, None] * HEAD_DIM + d[None, :]
    q = tl.load(q_ptr + q_offs, mask=g_valid[:, None], other=0.0)
    out_dtype = q.dtype
    q = q.to(tl.float16) if F16 else q

    first_page, lo, hi, m, denom, acc = split_start(kv_indptr_ptr, kv_last_ptr, b, split, PAGE_SIZE, BLOCK_T, SPLITS,
                                                    BLOCK_G, HEAD_DIM)
    for t0 in range(lo, hi, BLOCK_T):
        slot, t_valid = tile_slots(kv_indices_ptr, first_page, t0, hi, PAGE_SIZE, BLOCK_T)
        kv_offs = slot[:, None] * KV_ROW + kv_head * HEAD_DIM + d[None, :]
        k = tl.load(k_cache_ptr + kv_offs, mask=t_valid[:, None], other=0.0).to(q.dtype)
        v = tl.load(v_cache_ptr + kv_offs, mask=t_valid[:, None], other=0.0).to(q.dtype)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if FP8:
            k_scale = tl.load(k_scale_ptr + slot * NUM_KV_HEADS + kv_head, mask=t_valid, other=0.0)
            v_scale = tl.load(v_scale_ptr + slot * NUM_KV_HEADS + kv_head, mask=t_valid, other=0.0)
            scores = scores * k_scale[None, :]
        scores = tl.where(t_valid[None, :], scores * sm_scale, float("-inf"))
        p, alpha, m_new, denom = softmax_step(scores, m, denom)
        if FP8:
            p = p * v_scale[None, :]
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=DOT_PRECISION)
        m = m_new

    if SPLITS == 1:
        tl.store(out_ptr + q_offs, (acc / denom[:, None]).to(out_dtype), mask=g_valid[:, None])
    else:
        finish_split(acc, m, denom, part_o_ptr, part_lse_ptr, counter_ptr + b * NUM_KV_HEADS + kv_head,
                     (b * NUM_KV_HEADS + kv_head) * SPLITS, split, out_ptr + q_offs, g, g_valid, BLOCK_G,
                     HEAD_DIM, SPLITS, SPLITS)
