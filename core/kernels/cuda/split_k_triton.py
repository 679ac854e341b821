"""The Triton kernel behind core/kernels/cuda/split_k.py (a module of its own: it imports triton at the top)."""

import triton
import triton.language as tl


@triton.jit
def add_rms_norm_partials_kernel(partials_ptr, residual_ptr, weight_ptr, out_ptr, rows, eps,
                                 SPLITS: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    """Program i: row i's partial products summed in float32 with its residual; the sum stored as the new
    residual (rounded to its dtype) and its RMSNorm, scaled by the weight, as the output."""
    i = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    valid = offs < WIDTH
    total = tl.load(residual_ptr + i * WIDTH + offs, mask=valid, other=0.0).to(tl.float32)
    for s in tl.static_range(SPLITS):
        total += tl.load(partials_ptr + (s * rows + i) * WIDTH + offs, mask=valid, other=0.0).to(tl.float32)
    tl.store(residual_ptr + i * WIDTH + offs, total.to(residual_ptr.dtype.element_ty), mask=valid)
    scale = tl.rsqrt(tl.sum(total * total, axis=0) / WIDTH + eps)
    weight = tl.load(weight_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    tl.store(out_ptr + i * WIDTH + offs, (total * scale * weight).to(out_ptr.dtype.element_ty), mask=valid)
