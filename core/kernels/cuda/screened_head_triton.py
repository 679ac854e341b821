"""The Triton kernel behind core/kernels/cuda/screened_head.py (see there for what it does and why).

A module of its own because it imports triton at the top: Triton resolves the helpers a kernel calls among
its module's globals, and the rest of the engine must import without triton installed.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize_on_alignment=["h_ptr"])
def screen_estimate_kernel(h_ptr, q_ptr, scale_ptr, upper_ptr, best_ptr, N, error_per_l1, rel_margin,
                           K: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, SLOTS: tl.constexpr,
                           CHUNK: tl.constexpr):
    """For this program's BLOCK_V rows: each logit's estimate ``scale * (q . h)`` on the int8 copy, its upper
    end (estimate + bound) stored, and the block's best lower end (estimate - bound) raised into one of the
    SLOTS floats at ``best_ptr`` (thousands of programs raising one float would queue at its atomic unit; the
    gated GEMV takes the largest of the slots).

    The bound is ``A + rel_margin * (|estimate| + A)`` with ``A = scale * |h|_1 * error_per_l1``: the int8
    rounding and both sides' float32 sums (``error_per_l1``), the exact logit's rounding to the model's dtype
    and the bound's own arithmetic (``rel_margin``); screened_head.py derives both. The row is taken
    CHUNK columns at a time (fewer registers a thread, more programs an SM reading at once)."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_V + tl.arange(0, BLOCK_V)
    r_mask = rows < N
    dot = tl.zeros((BLOCK_V,), tl.float32)
    l1 = 0.0
    for k0 in tl.static_range(0, BLOCK_K, CHUNK):
        k = k0 + tl.arange(0, CHUNK)
        k_mask = k < K
        q = tl.load(q_ptr + rows.to(tl.int64)[:, None] * K + k[None, :], mask=r_mask[:, None] & k_mask[None, :],
                    other=0)
        h = tl.load(h_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
        l1 += tl.sum(tl.abs(h), axis=0)
        dot += tl.sum(q.to(tl.float32) * h[None, :], axis=1)
    scale = tl.load(scale_ptr + rows, mask=r_mask, other=0.0)
    estimate = scale * dot
    a = scale * l1 * error_per_l1
    bound = a + rel_margin * (tl.abs(estimate) + a)
    tl.store(upper_ptr + rows, estimate + bound, mask=r_mask)
    lower = tl.where(r_mask, estimate - bound, float("-inf"))
    tl.atomic_max(best_ptr + pid % SLOTS, tl.max(lower, axis=0))
