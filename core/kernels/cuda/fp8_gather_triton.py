"""The Triton kernel behind core/kernels/cuda/fp8_gather.py (a module of its own: it imports triton at the top)."""

import triton
import triton.language as tl


@triton.jit
def fp8_gather_kernel(k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, slots_ptr, k_out_ptr, v_out_ptr,
                      HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    """Program (i, side): token i's keys (side 0) or values (side 1), every head, dequantised in float32 and
    rounded once to the output's dtype, as core/kvcache/pool.py's dequantize_fp8 computes them."""
    i = tl.program_id(0)
    side = tl.program_id(1)
    slot = tl.load(slots_ptr + i).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    valid = offs < HEADS * HEAD_DIM
    if side == 0:
        src, scales, dst = k_ptr, k_scale_ptr, k_out_ptr
    else:
        src, scales, dst = v_ptr, v_scale_ptr, v_out_ptr
    values = tl.load(src + slot * HEADS * HEAD_DIM + offs, mask=valid, other=0.0).to(tl.float32)
    scale = tl.load(scales + slot * HEADS + offs // HEAD_DIM, mask=valid, other=0.0)
    tl.store(dst + i.to(tl.int64) * HEADS * HEAD_DIM + offs, (values * scale).to(dst.dtype.element_ty), mask=valid)
