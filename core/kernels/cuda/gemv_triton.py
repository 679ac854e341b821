"""The Triton kernel behind core/kernels/cuda/gemv.py (see there for what it does and why).

A module of its own because it imports triton at the top: Triton resolves the helpers a kernel calls among
its module's globals, and the rest of the engine must import without triton installed.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def input_chunk(x_ptr, res_ptr, offs_k, k_mask, K: tl.constexpr, PROLOGUE: tl.constexpr,
                HAS_RESIDUAL: tl.constexpr):
    """A chunk of the row the weight multiplies, in float32: x (+ residual, rounded as the residual stream
    is), or silu(gate) * up rounded once as a separate activation kernel would round it."""
    x = tl.load(x_ptr + offs_k, mask=k_mask, other=0.0)
    if PROLOGUE == 2:
        up = tl.load(x_ptr + K + offs_k, mask=k_mask, other=0.0).to(tl.float32)
        gate = x.to(tl.float32)
        return (gate / (1.0 + tl.exp(-gate)) * up).to(x.dtype).to(tl.float32)
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + offs_k, mask=k_mask, other=0.0)
        return (x.to(tl.float32) + res.to(tl.float32)).to(x.dtype).to(tl.float32)
    return x.to(tl.float32)


# the row comes at any offset of a step's buffers: specialising on alignment would compile a new variant in the
# middle of a run
@triton.jit(do_not_specialize_on_alignment=["x_ptr", "res_ptr", "res_out_ptr", "out_ptr"])
def gemv_kernel(x_ptr, res_ptr, res_out_ptr, norm_ptr, eps, w_ptr, bias_ptr, out_ptr, N, K: tl.constexpr,
                PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pid = tl.program_id(0)
    gemv_block(pid, x_ptr, res_ptr, res_out_ptr, norm_ptr, eps, w_ptr, bias_ptr, out_ptr, N, K, PROLOGUE,
               HAS_RESIDUAL, HAS_BIAS, BLOCK_N, BLOCK_K, PDL)


@triton.jit(do_not_specialize_on_alignment=["x_ptr", "out_ptr"])
def gated_gemv_kernel(x_ptr, w_ptr, out_ptr, upper_ptr, best_ptr, N, K: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP: tl.constexpr, SLOTS: tl.constexpr):
    """gemv_kernel's plain product for the blocks of BLOCK_N features where some feature's upper bound
    (``upper_ptr``) reaches the largest of the SLOTS values at ``best_ptr``; the other features get -inf and no
    weight is read for them. A program looks at GROUP blocks at once (most have nothing to compute, so one program a block would spend
    the kernel starting programs); a kept block runs gemv_kernel's own code with its tile, so its outputs are
    the ungated kernel's bit for bit (the screened LM head)."""
    pid = tl.program_id(0)
    blocks = pid * GROUP + tl.arange(0, GROUP)
    offs = blocks[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    mask = offs < N
    upper = tl.load(upper_ptr + offs, mask=mask, other=float("-inf"))
    best = tl.max(tl.load(best_ptr + tl.arange(0, SLOTS)), axis=0)
    keep = tl.max(upper, axis=1) >= best  # [GROUP]
    tl.store(out_ptr + offs, tl.full((GROUP, BLOCK_N), float("-inf"), out_ptr.dtype.element_ty), mask=mask)
    if tl.max(keep.to(tl.int32), axis=0) > 0:
        tl.debug_barrier()  # the -inf stores before a kept block's own (the same program overwrites them)
        for g in tl.static_range(GROUP):
            if tl.sum(tl.where(tl.arange(0, GROUP) == g, keep.to(tl.int32), 0), axis=0) > 0:
                gemv_block(pid * GROUP + g, x_ptr, x_ptr, x_ptr, x_ptr, 0.0, w_ptr, x_ptr, out_ptr, N, K, 0, False,
                           False, BLOCK_N, BLOCK_K, False)


@triton.jit
def gemv_block(pid, x_ptr, res_ptr, res_out_ptr, norm_ptr, eps, w_ptr, bias_ptr, out_ptr, N, K: tl.constexpr,
               PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """out[n] = sum_k w[n, k] * a[k] for this program's BLOCK_N features, where a is the input row after the
    prologue (PROLOGUE 0: none, 1: RMSNorm of x (+ residual), 2: silu(gate) * up).

    With PDL (launched as a programmatic dependent launch) the program lets the next kernel start at once and
    loads its weight rows before it waits for the previous kernel: the weight is constant, the row is that
    kernel's output, so the weight's read overlaps the previous kernel's tail. It then reads the whole row in
    one chunk (BLOCK_K >= K)."""
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    dtype = out_ptr.dtype.element_ty
    if PDL:
        gdc_launch_dependents()
    if BLOCK_K >= K:  # the whole row in one chunk (always with a folded norm: its mean square is at hand)
        offs_k = tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :],
                    other=0.0)
        if PDL:
            gdc_wait()
        h = input_chunk(x_ptr, res_ptr, offs_k, k_mask, K, PROLOGUE, HAS_RESIDUAL)
        if PROLOGUE == 1:
            if HAS_RESIDUAL:
                if pid == 0:
                    tl.store(res_out_ptr + offs_k, h.to(dtype), mask=k_mask)
            inv_rms = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / K + eps)
            gain = tl.load(norm_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)
            h = (h * inv_rms * gain).to(dtype).to(tl.float32)
        acc = tl.sum(w.to(tl.float32) * h[None, :], axis=1)
    else:
        tl.static_assert(PROLOGUE != 1 and not PDL, "a folded norm and PDL read the whole row in one chunk")
        acc = tl.zeros((BLOCK_N,), tl.float32)
        for k0 in tl.static_range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < K
            w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :],
                        other=0.0)
            a = input_chunk(x_ptr, res_ptr, offs_k, k_mask, K, PROLOGUE, HAS_RESIDUAL)
            acc += tl.sum(w.to(tl.float32) * a[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs_n, acc.to(dtype), mask=n_mask)
