"""The end of a decode-attention program whose request's cached tokens were split over several programs: a
Triton helper shared by the small-batch decode (small_decode_triton.py) and the paged decode's two variants
(paged_decode_triton.py, paged_decode_rows_triton.py); and the paged decode's split share, page walk and
online-softmax start and step, which its variants share.

Each split stores its partial output and log-sum-exp and counts itself done on a per-(request, KV head)
counter; the last one to arrive merges every split (weights from the log-sum-exps) and resets the counter, so
no second launch is needed and the counters are zero again for the next layer.
"""

import triton
import triton.language as tl


@triton.jit
def finish_split(acc, m, denom, part_o_ptr, part_lse_ptr, counter, first, split, out_ptrs, g, g_valid,
                 BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr, active):
    """``acc`` [BLOCK_G, HEAD_DIM], ``m`` and ``denom`` [BLOCK_G]: this split's online-softmax state; ``first``
    the index of split 0's partial result; ``out_ptrs`` where the merged rows go. ``active``: how many of the
    SPLITS programs take part (the first ones; the small decode uses fewer for a short context)."""
    d = tl.arange(0, HEAD_DIM)
    part = first + split
    has_tokens = denom > 0
    tl.store(part_o_ptr + (part * BLOCK_G + g)[:, None] * HEAD_DIM + d[None, :],
             tl.where(has_tokens[:, None], acc / denom[:, None], 0.0), mask=g_valid[:, None])
    tl.store(part_lse_ptr + part * BLOCK_G + g, tl.where(has_tokens, m + tl.log(denom), float("-inf")))
    tl.debug_barrier()  # every thread's partial results are written before the count says so
    if tl.atomic_add(counter, 1, sem="acq_rel") == active - 1:
        # every split's log-sum-exp in one load; the partial outputs in an unrolled loop, so that all their
        # loads are in flight together (bypassing L1: other SMs wrote them); idle splits' stale slots unread
        splits = tl.arange(0, SPLITS)
        lse = tl.load(part_lse_ptr + (first + splits)[:, None] * BLOCK_G + g[None, :], mask=(splits < active)[:, None],
                      other=float("-inf"), cache_modifier=".cg")
        weights = tl.exp(lse - tl.max(lse, axis=0)[None, :])  # [SPLITS, BLOCK_G]
        merged = tl.zeros((BLOCK_G, HEAD_DIM), tl.float32)
        for s in tl.static_range(SPLITS):
            o = tl.load(part_o_ptr + ((first + s) * BLOCK_G + g)[:, None] * HEAD_DIM + d[None, :],
                        mask=(g_valid & (g * 0 + s < active))[:, None], other=0.0, cache_modifier=".cg")
            merged += tl.sum(tl.where(splits[:, None] == s, weights, 0.0), axis=0)[:, None] * o
        total = tl.sum(weights, axis=0)
        tl.store(out_ptrs, (merged / total[:, None]).to(out_ptrs.dtype.element_ty), mask=g_valid[:, None])
        tl.store(counter, 0)  # ready for the next layer


@triton.jit
def split_range(kv_indptr_ptr, kv_last_ptr, b, split, PAGE_SIZE: tl.constexpr, BLOCK_T: tl.constexpr,
                SPLITS: tl.constexpr):
    """Request ``b``'s first page in the page list and this split's share of its cached tokens, [lo, hi), in
    whole blocks of BLOCK_T."""
    first_page = tl.load(kv_indptr_ptr + b)
    pages = tl.load(kv_indptr_ptr + b + 1) - first_page
    length = (pages - 1) * PAGE_SIZE + tl.load(kv_last_ptr + b)
    share = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_T) * BLOCK_T
    lo = split * share
    return first_page, lo, tl.minimum(lo + share, length)


@triton.jit
def split_start(kv_indptr_ptr, kv_last_ptr, b, split, PAGE_SIZE: tl.constexpr, BLOCK_T: tl.constexpr,
                SPLITS: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
    """``split_range``, and the online softmax's empty state for ROWS query rows of COLS output columns: the
    running maximum, the denominator and the accumulator."""
    first_page, lo, hi = split_range(kv_indptr_ptr, kv_last_ptr, b, split, PAGE_SIZE, BLOCK_T, SPLITS)
    m = tl.full((ROWS,), float("-inf"), tl.float32)
    return first_page, lo, hi, m, tl.zeros((ROWS,), tl.float32), tl.zeros((ROWS, COLS), tl.float32)


@triton.jit
def tile_slots(kv_indices_ptr, first_page, t0, hi, PAGE_SIZE: tl.constexpr, BLOCK_T: tl.constexpr):
    """The pool slots (int64) of a request's tokens [t0, t0 + BLOCK_T) through its page list, and which of those
    tokens are below ``hi`` (the others' slots are 0, not to be read)."""
    t = t0 + tl.arange(0, BLOCK_T)
    t_valid = t < hi
    page = tl.load(kv_indices_ptr + first_page + t // PAGE_SIZE, mask=t_valid, other=0).to(tl.int64)
    return page * PAGE_SIZE + t % PAGE_SIZE, t_valid


@triton.jit
def softmax_step(scores, m, denom):
    """One tile's step of the online softmax: ``scores`` [rows, tokens] (masked ones -inf) against the running
    maximum ``m`` and denominator ``denom`` [rows]; returns (p, the factor for what came before, the new
    maximum, the new denominator)."""
    m_new = tl.maximum(m, tl.max(scores, axis=1))
    p = tl.exp(scores - m_new[:, None])
    alpha = tl.exp(m - m_new)
    return p, alpha, m_new, denom * alpha + tl.sum(p, axis=1)
