"""The paged decode's all-heads variant (``DecodeTile.all_heads``, see core/kernels/cuda/paged_decode.py for why it
exists): one program per (request, split) reads whole token rows, every KV head at once. Two formulations of
its products (``DecodeTile.head_dots``): one block-diagonal product over whole rows, or 3-D products batched
per KV head with the query group on the narrow side.

A module of its own because it imports triton at the top; the rest of the engine imports without triton.
"""

import triton
import triton.language as tl

from core.kernels.cuda.split_merge_triton import (finish_split, softmax_step, split_range, split_start,
                                                     tile_slots)


@triton.jit
def paged_decode_rows_kernel(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, kv_indptr_ptr,
                             kv_indices_ptr, kv_last_ptr, part_o_ptr, part_lse_ptr, counter_ptr, out_ptr, sm_scale,
                             NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                             PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr, BLOCK_H: tl.constexpr,
                             BLOCK_ROW: tl.constexpr, BLOCK_T: tl.constexpr, SPLITS: tl.constexpr,
                             FP8: tl.constexpr, F16: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One program per (request, split of the cached tokens): every query head against the split's tiles of
    whole token rows ([BLOCK_T, kv_heads * head_dim], contiguous within a page), online softmax; with more
    than one split the last one to finish merges.

    The query is a block-diagonal matrix [BLOCK_H, BLOCK_ROW]: row r holds q_r in the columns of its KV head
    (r // GROUP) and zeros elsewhere, so ``q_bd @ k^T`` gives every head's scores at once with every row real
    (16 query heads: exactly a tensor-core product's 16 rows). ``p @ v`` yields each row against every KV
    head's values; only the block diagonal (row r, its KV head's columns) is the output. With FP8 the scales
    (one per slot and KV head) are gathered per row and multiplied into the scores and into p, as in the
    per-head kernel. BLOCK_H pads the heads to a power of two of at least 16, BLOCK_ROW the row likewise."""
    b = tl.program_id(0)
    split = tl.program_id(1)
    KV_ROW: tl.constexpr = NUM_KV_HEADS * HEAD_DIM
    rows = tl.arange(0, BLOCK_H)
    rows_valid = rows < NUM_HEADS
    row_kv_head = rows // GROUP
    cols = tl.arange(0, BLOCK_ROW)
    cols_valid = cols < KV_ROW
    own = (row_kv_head[:, None] == (cols // HEAD_DIM)[None, :]) & rows_valid[:, None]  # the block diagonal
    q_rows = (b * NUM_HEADS + rows) * HEAD_DIM
    q_bd = tl.load(q_ptr + q_rows[:, None] + (cols % HEAD_DIM)[None, :], mask=own, other=0.0)
    q_bd = q_bd.to(tl.float16) if F16 else q_bd

    first_page, lo, hi, m, denom, acc = split_start(kv_indptr_ptr, kv_last_ptr, b, split, PAGE_SIZE, BLOCK_T, SPLITS,
                                                    BLOCK_H, BLOCK_ROW)
    for t0 in range(lo, hi, BLOCK_T):
        slot, t_valid = tile_slots(kv_indices_ptr, first_page, t0, hi, PAGE_SIZE, BLOCK_T)
        kv_offs = slot[:, None] * KV_ROW + cols[None, :]
        kv_mask = t_valid[:, None] & cols_valid[None, :]
        k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(q_bd.dtype)
        v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(q_bd.dtype)
        scores = tl.dot(q_bd, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_H, BLOCK_T]
        p, alpha, m, denom = rows_softmax_step(scores, m, denom, sm_scale, k_scale_ptr, v_scale_ptr, slot, t_valid,
                                               row_kv_head, rows_valid, NUM_KV_HEADS, FP8)
        acc = acc * alpha[:, None] + tl.dot(p.to(q_bd.dtype), v, input_precision=DOT_PRECISION)

    # row r's own KV head's columns: [BLOCK_H, kv heads (padded), HEAD_DIM] summed over the zeroed others
    diagonal = tl.where(own, acc, 0.0).reshape(BLOCK_H, BLOCK_ROW // HEAD_DIM, HEAD_DIM)
    o = tl.sum(diagonal, axis=1)
    finish_rows(o, m, denom, part_o_ptr, part_lse_ptr, counter_ptr, out_ptr, b, split, q_rows, rows, rows_valid,
                BLOCK_H, HEAD_DIM, SPLITS)


@triton.jit
def paged_decode_head_dots_kernel(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, kv_indptr_ptr,
                                  kv_indices_ptr, kv_last_ptr, part_o_ptr, part_lse_ptr, counter_ptr, out_ptr,
                                  sm_scale, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                                  HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr,
                                  BLOCK_G: tl.constexpr, BLOCK_KV: tl.constexpr, BLOCK_T: tl.constexpr,
                                  SPLITS: tl.constexpr, FP8: tl.constexpr, F16: tl.constexpr,
                                  DOT_PRECISION: tl.constexpr):
    """The same program as ``paged_decode_rows_kernel`` with the products batched per KV head (3-D dots, one
    KV head's to a warp: Triton splits a batched product's warps over the batch) and the query group on the
    narrow side: scores [KV, BLOCK_T, GROUP] = k [KV, BLOCK_T, HEAD_DIM] @ q [KV, HEAD_DIM, GROUP], and the
    output [KV, HEAD_DIM, GROUP] = v^T @ p. Triton pads a product's narrow side to the 8 columns of a
    tensor-core instruction, so a group of 2 fills a quarter of each, against an eighth in the block-diagonal
    product and the per-head kernel's 16 rows; the softmax runs on the real (KV head, group) rows only, and
    the scales are one per (KV head, token), with no gather per row. Compiled for sm_90 its loop takes fewer
    warp instructions per KB of KV than the per-head kernel's or the block-diagonal product's (which makes every
    warp walk all 1024 columns of a row and convert another warp's keys; docs/BENCHMARKS.md)."""
    b = tl.program_id(0)
    split = tl.program_id(1)
    KV_ROW: tl.constexpr = NUM_KV_HEADS * HEAD_DIM
    kv_heads = tl.arange(0, BLOCK_KV)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, HEAD_DIM)
    kv_valid = kv_heads < NUM_KV_HEADS
    head_valid = kv_valid[:, None] & (g < GROUP)[None, :]  # [KV, G]
    heads = kv_heads[:, None] * GROUP + g[None, :]
    head_offs = (b * NUM_HEADS + heads)[:, None, :] * HEAD_DIM + d[None, :, None]  # [KV, HEAD_DIM, G]
    q = tl.load(q_ptr + head_offs, mask=head_valid[:, None, :], other=0.0)
    q = q.to(tl.float16) if F16 else q

    first_page, lo, hi = split_range(kv_indptr_ptr, kv_last_ptr, b, split, PAGE_SIZE, BLOCK_T, SPLITS)
    m = tl.full((BLOCK_KV, BLOCK_G), float("-inf"), tl.float32)
    denom = tl.zeros((BLOCK_KV, BLOCK_G), tl.float32)
    acc = tl.zeros((BLOCK_KV, HEAD_DIM, BLOCK_G), tl.float32)
    for t0 in range(lo, hi, BLOCK_T):
        slot, t_valid = tile_slots(kv_indices_ptr, first_page, t0, hi, PAGE_SIZE, BLOCK_T)
        kv_offs = slot[None, :, None] * KV_ROW + kv_heads[:, None, None] * HEAD_DIM + d[None, None, :]
        kv_mask = t_valid[None, :, None] & kv_valid[:, None, None]
        k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(q.dtype)  # [KV, BLOCK_T, HEAD_DIM]
        v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(q.dtype)
        scores = tl.dot(k, q, input_precision=DOT_PRECISION)  # [KV, BLOCK_T, G]
        if FP8:
            scale_offs = slot[None, :] * NUM_KV_HEADS + kv_heads[:, None]  # [KV, BLOCK_T]
            scale_mask = kv_valid[:, None] & t_valid[None, :]
            scores = scores * tl.load(k_scale_ptr + scale_offs, mask=scale_mask, other=0.0)[:, :, None]
        scores = tl.where(t_valid[None, :, None], scores * sm_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        p = tl.exp(scores - m_new[:, None, :])
        alpha = tl.exp(m - m_new)
        denom = denom * alpha + tl.sum(p, axis=1)
        if FP8:
            p = p * tl.load(v_scale_ptr + scale_offs, mask=scale_mask, other=0.0)[:, :, None]
        acc = acc * alpha[:, None, :] + tl.dot(tl.trans(v, 0, 2, 1), p.to(q.dtype), input_precision=DOT_PRECISION)
        m = m_new

    if SPLITS == 1:
        tl.store(out_ptr + head_offs, (acc / denom[:, None, :]).to(out_ptr.dtype.element_ty),
                 mask=head_valid[:, None, :])
    else:  # the partial results as rows (KV head, group slot), as the merge takes them
        BLOCK_ROWS: tl.constexpr = BLOCK_KV * BLOCK_G
        rows = tl.arange(0, BLOCK_ROWS)
        row_heads = (rows // BLOCK_G) * GROUP + rows % BLOCK_G
        rows_valid = (rows % BLOCK_G < GROUP) & (rows // BLOCK_G < NUM_KV_HEADS)
        out_ptrs = out_ptr + (b * NUM_HEADS + row_heads)[:, None] * HEAD_DIM + d[None, :]
        o = tl.reshape(tl.permute(acc, 0, 2, 1), (BLOCK_ROWS, HEAD_DIM))
        finish_split(o, tl.reshape(m, (BLOCK_ROWS,)), tl.reshape(denom, (BLOCK_ROWS,)), part_o_ptr, part_lse_ptr,
                     counter_ptr + b, b * SPLITS, split, out_ptrs, rows, rows_valid, BLOCK_ROWS, HEAD_DIM, SPLITS,
                     SPLITS)


@triton.jit
def rows_softmax_step(scores, m, denom, sm_scale, k_scale_ptr, v_scale_ptr, slot, t_valid, row_kv_head, rows_valid,
                      NUM_KV_HEADS: tl.constexpr, FP8: tl.constexpr):
    """One tile's online-softmax step on every head's raw scores [rows, tokens]; with FP8 the k scales go into
    the scores and the v scales into p (row r's scale of token t is its KV head's, scale[slot_t, r // GROUP]).
    Returns (p, the factor for what came before, the new maximum, the new denominator)."""
    if FP8:
        offs = slot[None, :] * NUM_KV_HEADS + row_kv_head[:, None]
        mask = rows_valid[:, None] & t_valid[None, :]
        scores = scores * tl.load(k_scale_ptr + offs, mask=mask, other=0.0)
    scores = tl.where(t_valid[None, :], scores * sm_scale, float("-inf"))
    p, alpha, m, denom = softmax_step(scores, m, denom)
    if FP8:
        p = p * tl.load(v_scale_ptr + offs, mask=mask, other=0.0)
    return p, alpha, m, denom


@triton.jit
def finish_rows(o, m, denom, part_o_ptr, part_lse_ptr, counter_ptr, out_ptr, b, split, q_rows, rows, rows_valid,
                BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr):
    """Every head's output row of request ``b``: stored, or with splits this split's partial result, merged by
    the last split to finish (one counter per request)."""
    d = tl.arange(0, HEAD_DIM)
    out_ptrs = out_ptr + q_rows[:, None] + d[None, :]
    if SPLITS == 1:
        tl.store(out_ptrs, (o / denom[:, None]).to(out_ptrs.dtype.element_ty), mask=rows_valid[:, None])
    else:
        finish_split(o, m, denom, part_o_ptr, part_lse_ptr, counter_ptr + b, b * SPLITS, split, out_ptrs, rows,
                     rows_valid, BLOCK_H, HEAD_DIM, SPLITS, SPLITS)
