"""The Triton kernel behind core/layers/gemv.py (see there for what it does and why).

A module of its own because it imports triton at the top: Triton resolves the helpers a kernel calls among
its module's globals, and the rest of the engine must import without triton installed.
"""

import triton
import triton.language as tl


@triton.jit
def prologue_row(x_row, res_row, offs_k, k_mask, K: tl.constexpr, PROLOGUE: tl.constexpr,
                 HAS_RESIDUAL: tl.constexpr):
    """One row's input chunk in float32, before any norm: x (+ residual, rounded), or silu(gate) * up."""
    x = tl.load(x_row + offs_k, mask=k_mask, other=0.0)
    if PROLOGUE == 2:
        up = tl.load(x_row + K + offs_k, mask=k_mask, other=0.0).to(tl.float32)
        gate = x.to(tl.float32)
        return (gate / (1.0 + tl.exp(-gate)) * up).to(x.dtype).to(tl.float32)
    if HAS_RESIDUAL:
        res = tl.load(res_row + offs_k, mask=k_mask, other=0.0)
        return (x.to(tl.float32) + res.to(tl.float32)).to(x.dtype).to(tl.float32)
    return x.to(tl.float32)

# input rows come at any offset of a step's buffers: specialising on their alignment would compile a new
# variant in the middle of a run
@triton.jit(do_not_specialize_on_alignment=["x_ptr", "res_ptr", "res_out_ptr", "out_ptr"])
def gemv_kernel(x_ptr, x_stride, res_ptr, res_stride, res_out_ptr, norm_ptr, eps, w_ptr, bias_ptr, out_ptr,
                out_stride, N, M: tl.constexpr, K: tl.constexpr, PROLOGUE: tl.constexpr,
                HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rows = tl.arange(0, BLOCK_M)
    dtype = out_ptr.dtype.element_ty

    inv_rms = tl.zeros((BLOCK_M,), tl.float32)
    if PROLOGUE == 1:  # each row's 1 / rms over all K columns; program 0 also writes the new residual
        for m in tl.static_range(M):
            square_sum = 0.0
            for k0 in tl.static_range(0, K, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                k_mask = offs_k < K
                h = prologue_row(x_ptr + m * x_stride, res_ptr + m * res_stride, offs_k, k_mask, K, PROLOGUE,
                                 HAS_RESIDUAL)
                square_sum += tl.sum(h * h, axis=0)
                if HAS_RESIDUAL:
                    if pid == 0:
                        tl.store(res_out_ptr + m * K + offs_k, h.to(dtype), mask=k_mask)
            inv_rms = tl.where(rows == m, 1.0 / tl.sqrt(square_sum / K + eps), inv_rms)

    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in tl.static_range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :],
                    other=0.0).to(tl.float32)
        if PROLOGUE == 1:
            gain = tl.load(norm_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)
        for m in tl.static_range(M):
            a = prologue_row(x_ptr + m * x_stride, res_ptr + m * res_stride, offs_k, k_mask, K, PROLOGUE,
                             HAS_RESIDUAL)
            if PROLOGUE == 1:
                row_inv = tl.sum(tl.where(rows == m, inv_rms, 0.0), axis=0)
                a = (a * row_inv * gain).to(dtype).to(tl.float32)
            part = tl.sum(w * a[None, :], axis=1)
            acc += tl.where(rows[:, None] == m, part[None, :], 0.0)

    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rows[:, None] * out_stride + offs_n[None, :]
    tl.store(out, acc.to(dtype), mask=(rows[:, None] < M) & n_mask[None, :])
