"""The paged decode's CUDA-core variant (``DecodeTile.cuda_cores``; see core/kernels/paged_decode.py).

A decode query group is a few rows (2 for Qwen3-0.6B): a tensor-core product pads it to 16, so the per-head
kernel spends most of its work per cached token on rows that are not there. Here the two products are plain
multiply-and-sum on the CUDA cores over the group's real rows (padded to a power of two only): scores are
``sum_d q[g, d] * k[t, d]`` and the output ``sum_t p[g, t] * v[t, d]``, each over a [group, tokens, head_dim]
block. For groups of 2 that is 8x fewer multiplications than the padded product, and the softmax runs on 2
rows instead of 16.

A module of its own because it imports triton at the top; the rest of the engine imports without triton.
"""

import triton
import triton.language as tl

from core.kernels.split_merge_triton import finish_split, softmax_step, split_range, token_slots


@triton.jit
def paged_decode_cores_kernel(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, kv_indptr_ptr,
                              kv_indices_ptr, kv_last_ptr, part_o_ptr, part_lse_ptr, counter_ptr, out_ptr, sm_scale,
                              NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                              PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                              BLOCK_T: tl.constexpr, SPLITS: tl.constexpr, FP8: tl.constexpr,
                              DEFER_SUM: tl.constexpr):
    """One program per (request, KV head, split), as the per-head kernel (paged_decode_triton.py), with float32
    products on the CUDA cores. With FP8 the scales come out of the sums as there: q . k = k_scale * (q . k8)
    and p . v = (p * v_scale) . v8. DEFER_SUM keeps a [group, tokens, head_dim] accumulator and sums over the
    tokens once at the end, so the loop's values stay in the layout they were loaded in."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    KV_ROW: tl.constexpr = NUM_KV_HEADS * HEAD_DIM
    d = tl.arange(0, HEAD_DIM)
    g = tl.arange(0, BLOCK_G)
    g_valid = g < GROUP
    heads = kv_head * GROUP + g
    q_offs = (b * NUM_HEADS + heads)[:, None] * HEAD_DIM + d[None, :]
    q_raw = tl.load(q_ptr + q_offs, mask=g_valid[:, None], other=0.0)
    q = q_raw.to(tl.float32) * sm_scale

    first_page, lo, hi = split_range(kv_indptr_ptr, kv_last_ptr, b, split, PAGE_SIZE, BLOCK_T, SPLITS)

    m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    denom = tl.zeros((BLOCK_G,), tl.float32)
    if DEFER_SUM:
        acc3 = tl.zeros((BLOCK_G, BLOCK_T, HEAD_DIM), tl.float32)
    else:
        acc = tl.zeros((BLOCK_G, HEAD_DIM), tl.float32)
    for t0 in range(lo, hi, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        t_valid = t < hi
        slot = token_slots(kv_indices_ptr, first_page, t, t_valid, PAGE_SIZE)
        kv_offs = slot[:, None] * KV_ROW + kv_head * HEAD_DIM + d[None, :]
        k = tl.load(k_cache_ptr + kv_offs, mask=t_valid[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + kv_offs, mask=t_valid[:, None], other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [BLOCK_G, BLOCK_T]
        if FP8:
            k_scale = tl.load(k_scale_ptr + slot * NUM_KV_HEADS + kv_head, mask=t_valid, other=0.0)
            v_scale = tl.load(v_scale_ptr + slot * NUM_KV_HEADS + kv_head, mask=t_valid, other=0.0)
            scores = scores * k_scale[None, :]
        scores = tl.where(t_valid[None, :], scores, float("-inf"))
        p, alpha, m_new, denom = softmax_step(scores, m, denom)
        if FP8:
            p = p * v_scale[None, :]
        if DEFER_SUM:
            acc3 = acc3 * alpha[:, None, None] + p[:, :, None] * v[None, :, :]
        else:
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    if DEFER_SUM:
        acc = tl.sum(acc3, axis=1)

    if SPLITS == 1:
        tl.store(out_ptr + q_offs, (acc / denom[:, None]).to(q_raw.dtype), mask=g_valid[:, None])
    else:
        finish_split(acc, m, denom, part_o_ptr, part_lse_ptr, counter_ptr + b * NUM_KV_HEADS + kv_head,
                     (b * NUM_KV_HEADS + kv_head) * SPLITS, split, out_ptr + q_offs, g, g_valid, BLOCK_G,
                     HEAD_DIM, SPLITS)
