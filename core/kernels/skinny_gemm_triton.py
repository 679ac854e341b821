"""The Triton kernel behind core/kernels/skinny_gemm.py (see there for what it does and why).

A module of its own because it imports triton at the top: Triton resolves the helpers a kernel calls among
its module's globals, and the rest of the engine must import without triton installed.
"""

import triton
import triton.language as tl

from core.kernels.gemv_triton import input_chunk


# a step's activations come at any offset of its buffers: specialising on alignment would compile a new variant
# in the middle of a run
@triton.jit(do_not_specialize_on_alignment=["x_ptr", "res_ptr", "res_out_ptr", "out_ptr"])
def skinny_gemm_kernel(x_ptr, res_ptr, res_out_ptr, norm_ptr, eps, w_ptr, bias_ptr, out_ptr, M, N,
                       K: tl.constexpr, X_STRIDE: tl.constexpr, PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                       HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       DOT_PRECISION: tl.constexpr):
    """out[m, n] = sum_k a[m, k] * w[n, k] for this program's BLOCK_M rows and BLOCK_N features,
    where a is the input after the prologue (0: none, 1: RMSNorm of x (+ residual), 2: silu(gate) * up).

    The rows are few, so a program holds all of them (or a large share: the programs of one block of features
    then read its weight rows together, from L2 after the first) and streams its weight rows once, BLOCK_K
    columns at a time, into tensor-core products. A folded norm first walks the rows once for their mean
    squares (the rows are a few KB, served from L2); program 0 writes the residual sum ``x + residual`` out."""
    pid = tl.program_id(0)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    x_rows = x_ptr + offs_m[:, None] * X_STRIDE
    res_rows = res_ptr + offs_m[:, None] * K
    dtype = out_ptr.dtype.element_ty
    inv_rms = tl.zeros((BLOCK_M,), tl.float32)
    if PROLOGUE == 1:
        squares = tl.zeros((BLOCK_M,), tl.float32)
        for k0 in tl.range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask = m_mask[:, None] & (offs_k < K)[None, :]
            h = input_chunk(x_rows, res_rows, offs_k[None, :], mask, K, PROLOGUE, HAS_RESIDUAL)
            squares += tl.sum(h * h, axis=1)
            if HAS_RESIDUAL:
                if pid == 0:  # the first program of each block of rows
                    tl.store(res_out_ptr + offs_m[:, None] * K + offs_k[None, :], h.to(dtype), mask=mask)
        inv_rms = 1.0 / tl.sqrt(squares / K + eps)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in tl.range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :],
                    other=0.0)
        a = input_chunk(x_rows, res_rows, offs_k[None, :], m_mask[:, None] & k_mask[None, :], K, PROLOGUE,
                        HAS_RESIDUAL)
        if PROLOGUE == 1:
            gain = tl.load(norm_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)
            a = a * inv_rms[:, None] * gain[None, :]
        acc += tl.dot(a.to(w.dtype), tl.trans(w), input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(dtype), mask=m_mask[:, None] & n_mask[None, :])
