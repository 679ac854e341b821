"""The Triton kernel behind core/kernels/gate_up_silu.py (see there for what it does and why).

A module of its own because it imports triton at the top: the rest of the engine must import without triton.
"""

import triton
import triton.language as tl


@triton.jit
def gate_up_silu_kernel(x_ptr, w_ptr, out_ptr, rows, x_stride, out_stride, K: tl.constexpr,
                        INTERMEDIATE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One program per (BLOCK_M rows, BLOCK_N intermediate features): the gate and the up products of those
    features side by side (the weight's rows n and INTERMEDIATE + n), then ``silu(gate) * up`` on them, each
    product first rounded to the output's dtype as the unfused GEMM's output is."""
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    m_valid = m < rows
    n_valid = n < INTERMEDIATE
    gate = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_valid = k0 + k < K
        x = tl.load(x_ptr + m[:, None] * x_stride + (k0 + k)[None, :], mask=m_valid[:, None] & k_valid[None, :],
                    other=0.0)
        w_mask = k_valid[:, None] & n_valid[None, :]
        w_gate = tl.load(w_ptr + n[None, :] * K + (k0 + k)[:, None], mask=w_mask, other=0.0)
        w_up = tl.load(w_ptr + (INTERMEDIATE + n)[None, :] * K + (k0 + k)[:, None], mask=w_mask, other=0.0)
        gate = tl.dot(x, w_gate, gate, input_precision=DOT_PRECISION)
        up = tl.dot(x, w_up, up, input_precision=DOT_PRECISION)
    dtype = out_ptr.dtype.element_ty
    gate = gate.to(dtype).to(tl.float32)
    up = up.to(dtype).to(tl.float32)
    h = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + m[:, None] * out_stride + n[None, :], h.to(dtype), mask=m_valid[:, None] & n_valid[None, :])
