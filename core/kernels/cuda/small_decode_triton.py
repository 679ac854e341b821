"""The Triton kernel behind core/kernels/cuda/small_decode.py (see there for what it does and why).

A module of its own because it imports triton at the top: Triton resolves the helpers a kernel calls among
its module's globals, and the rest of the engine must import without triton installed.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from core.kernels.cuda.fused_qkv_triton import kv_head_offset, norm_rope
from core.kernels.cuda.split_merge_triton import finish_split, tile_slots


@triton.jit
def cached_tile(k_cache_ptr, v_cache_ptr, kv_indices_ptr, first_page, t0, hi, kv_head, d, PAGE_SIZE: tl.constexpr,
                NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr,
                HEAD_BLOCK: tl.constexpr):
    """Keys and values of cached tokens [t0, t0 + BLOCK_T) of one KV head (zeros past ``hi``; nothing is read
    once t0 >= hi)."""
    slot, t_valid = tile_slots(kv_indices_ptr, first_page, t0, hi, PAGE_SIZE, BLOCK_T)
    kv_offs = kv_head_offset(slot, kv_head, NUM_KV_HEADS, HEAD_DIM, HEAD_BLOCK)[:, None] + d[None, :]
    k = tl.load(k_cache_ptr + kv_offs, mask=t_valid[:, None], other=0.0)
    v = tl.load(v_cache_ptr + kv_offs, mask=t_valid[:, None], other=0.0)
    return k, v


@triton.jit(do_not_specialize_on_alignment=["positions_ptr", "out_loc_ptr"])
def decode_attention_kernel(qkv_ptr, qkv_stride, positions_ptr, cos_sin_ptr, q_norm_ptr, k_norm_ptr, eps,
                            k_cache_ptr, v_cache_ptr, out_loc_ptr, kv_indptr_ptr, kv_indices_ptr, kv_last_ptr,
                            part_o_ptr, part_lse_ptr, counter_ptr, out_ptr, sm_scale,
                            NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                            PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                            BLOCK_T: tl.constexpr, SPLITS: tl.constexpr, NORM: tl.constexpr,
                            DOT_PRECISION: tl.constexpr, PDL: tl.constexpr, HEAD_BLOCK: tl.constexpr):
    """One program per (request, KV head, split of the cached tokens), of which a request uses one per tile of
    its context, up to SPLITS (the grid is fixed in the CUDA graph, the context is not). Split 0 also writes the
    new token's k and v into the pool and attends to them from registers; with more than one split in use, the
    last to finish merges them.

    The loop loads each tile of cached keys and values one iteration ahead. With PDL (a programmatic dependent
    launch) the first tile, the page list and the rotary rows are read before the program waits for the
    previous kernel (the QKV projection, whose output is the only input it writes): the cached tokens and the
    step's page lists are fixed before the step starts, so that chain of dependent loads overlaps the
    projection's tail."""
    if PDL:
        gdc_launch_dependents()
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # the cached tokens: positions [0, length - 1); as many splits as it has tiles (at most SPLITS), so that a
    # short context is not spread thin over programs that each pay the merge; this split's share in whole tiles
    first_page = tl.load(kv_indptr_ptr + b)
    pages = tl.load(kv_indptr_ptr + b + 1) - first_page
    cached = (pages - 1) * PAGE_SIZE + tl.load(kv_last_ptr + b) - 1
    active = tl.minimum(tl.maximum(tl.cdiv(cached, BLOCK_T), 1), SPLITS)
    if split < active:  # the idle programs of a short context leave at once
        HALF: tl.constexpr = HEAD_DIM // 2
        d = tl.arange(0, HEAD_DIM)
        qkv_row = qkv_ptr + b * qkv_stride
        position = tl.load(positions_ptr + b).to(tl.int64)
        cos = tl.load(cos_sin_ptr + position * HEAD_DIM + d % HALF)
        sin = tl.load(cos_sin_ptr + position * HEAD_DIM + HALF + d % HALF)
        share = tl.cdiv(tl.cdiv(cached, active), BLOCK_T) * BLOCK_T
        lo = split * share
        hi = tl.minimum(lo + share, cached)
        attend_split(qkv_row, b, kv_head, split, active, lo, hi, first_page, cos, sin, q_norm_ptr,
                     k_norm_ptr, eps, k_cache_ptr, v_cache_ptr, out_loc_ptr, kv_indices_ptr, part_o_ptr,
                     part_lse_ptr, counter_ptr, out_ptr, sm_scale, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE,
                     GROUP, BLOCK_G, BLOCK_T, SPLITS, NORM, DOT_PRECISION, PDL, HEAD_BLOCK)


@triton.jit
def attend_split(qkv_row, b, kv_head, split, active, lo, hi, first_page, cos, sin, q_norm_ptr,
                 k_norm_ptr, eps, k_cache_ptr, v_cache_ptr, out_loc_ptr, kv_indices_ptr, part_o_ptr, part_lse_ptr,
                 counter_ptr, out_ptr, sm_scale, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                 HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                 BLOCK_T: tl.constexpr, SPLITS: tl.constexpr, NORM: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 PDL: tl.constexpr, HEAD_BLOCK: tl.constexpr):
    """One active split's work: cached tokens [lo, hi) of one (request, KV head), the new token in split 0, and
    the merge by whichever of the ``active`` splits finishes last."""
    d = tl.arange(0, HEAD_DIM)
    g = tl.arange(0, BLOCK_G)
    g_valid = g < GROUP
    t0 = lo
    k, v = cached_tile(k_cache_ptr, v_cache_ptr, kv_indices_ptr, first_page, t0, hi, kv_head, d, PAGE_SIZE,
                       NUM_KV_HEADS, HEAD_DIM, BLOCK_T, HEAD_BLOCK)
    if PDL:
        gdc_wait()

    # this group's query heads and the new token's key and value
    q = norm_rope(qkv_row, kv_head * GROUP + g, g_valid, q_norm_ptr, eps, cos, sin, NORM, HEAD_DIM)
    one = tl.arange(0, 1)
    k_new = norm_rope(qkv_row, NUM_HEADS + kv_head + one, one < 1, k_norm_ptr, eps, cos, sin, NORM, HEAD_DIM)
    v_new = tl.load(qkv_row + (NUM_HEADS + NUM_KV_HEADS + kv_head) * HEAD_DIM + d)

    m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    denom = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, HEAD_DIM), tl.float32)
    while t0 < hi:  # a while loop: Triton's interpreter (how the tests run it) takes no loaded loop bounds
        t_valid = t0 + tl.arange(0, BLOCK_T) < hi
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * sm_scale
        scores = tl.where(t_valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m - m_new)
        denom = denom * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new
        t0 += BLOCK_T
        k, v = cached_tile(k_cache_ptr, v_cache_ptr, kv_indices_ptr, first_page, t0, hi, kv_head, d, PAGE_SIZE,
                           NUM_KV_HEADS, HEAD_DIM, BLOCK_T, HEAD_BLOCK)

    if split == 0:  # the new token: written into its slot, attended to from registers
        slot_new = tl.load(out_loc_ptr + b).to(tl.int64)
        new_offs = kv_head_offset(slot_new, kv_head, NUM_KV_HEADS, HEAD_DIM, HEAD_BLOCK) + d
        tl.store(k_cache_ptr + new_offs[None, :], k_new)
        tl.store(v_cache_ptr + new_offs, v_new)
        score = tl.sum(q.to(tl.float32) * k_new.to(tl.float32), axis=1) * sm_scale
        m_new = tl.maximum(m, score)
        p_new = tl.exp(score - m_new)
        alpha = tl.exp(m - m_new)
        denom = denom * alpha + p_new
        acc = acc * alpha[:, None] + p_new[:, None] * v_new.to(tl.float32)[None, :]
        m = m_new

    heads = kv_head * GROUP + g
    out_offs = (b * NUM_HEADS + heads)[:, None] * HEAD_DIM + d[None, :]
    dtype = v_new.dtype
    if active == 1:  # one split, no merge
        tl.store(out_ptr + out_offs, (acc / denom[:, None]).to(dtype), mask=g_valid[:, None])
    else:
        finish_split(acc, m, denom, part_o_ptr, part_lse_ptr, counter_ptr + b * NUM_KV_HEADS + kv_head,
                     (b * NUM_KV_HEADS + kv_head) * SPLITS, split, out_ptr + out_offs, g, g_valid, BLOCK_G,
                     HEAD_DIM, SPLITS, active)
