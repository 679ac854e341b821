"""A narrow linear split over its inputs (split-K), with the sum of the parts folded into the residual add and
RMSNorm that follows it.

Why: o_proj and down have 1,024 outputs, too few output tiles for cuBLAS to fill a large GPU's SMs at decode row
counts, so they read their weights well under the copy rate (docs/BENCHMARKS.md). Cutting K
into ``splits`` slices and multiplying them as one strided batched GEMM gives the GEMM ``splits`` times the tiles;
every layer's narrow linear is followed by an add+RMSNorm, which can sum the slices' partial products as it adds
the residual, so the split costs no launch of its own.

``split_k_linear`` returns the partials [splits, rows, out]; ``add_rms_norm_partials`` is flashinfer's
``fused_add_rmsnorm`` on their sum (the residual updated in place, the normed rows returned).
"""

from __future__ import annotations

import torch

from core.arith import next_pow2

# decode steps only: a prefill chunk's thousands of rows fill the SMs without a split, and its float32 partials
# would be hundreds of MB to write and read back
SPLIT_K_MAX_ROWS = 256
# up to this many rows the narrow linears take at least FEW_ROWS_SLICES slices: the fewer the rows, the fewer the
# tiles, and the more a further split gains over what summing more partials costs the add+RMSNorm; above it the
# extra slices lose (docs/BENCHMARKS.md)
FEW_ROWS = 128
FEW_ROWS_SLICES = 4


def slices_for(rows: int, slices: int) -> int:
    """The slices a decode step's narrow linear of ``rows`` rows is cut into, given the engine's choice ``slices``
    (MINISGL_SPLIT_K; 0: no split): that choice, and at least FEW_ROWS_SLICES up to FEW_ROWS rows."""
    if slices <= 0 or rows > SPLIT_K_MAX_ROWS:
        return 0
    return max(slices, FEW_ROWS_SLICES) if rows <= FEW_ROWS else slices


def split_k_linear(x: torch.Tensor, weight: torch.Tensor, splits: int,
                   out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """[splits, rows, out] partial products of ``x @ weight.T``, slice s over inputs [s*K/splits, (s+1)*K/splits).

    Both operands are strided views (no copy): x [rows, K] as [splits, rows, K/splits] with row stride K, the
    weight [out, K] as [splits, K/splits, out]. ``out_dtype`` float32 keeps the partials unrounded where torch's
    batched GEMM takes one."""
    rows, k = x.shape
    out_features = weight.shape[0]
    if k % splits:
        raise ValueError(f"{k} inputs do not split into {splits} equal slices")
    part = k // splits
    xs = x.view(rows, splits, part).transpose(0, 1)
    ws = weight.view(out_features, splits, part).permute(1, 2, 0)
    if out_dtype is None or out_dtype == x.dtype:
        return torch.bmm(xs, ws)
    return torch.bmm(xs, ws, out_dtype=out_dtype)


def add_rms_norm_partials_reference(partials: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                    eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch's statement of the kernel: the parts summed and added to the residual in float32, the residual
    rounded to its dtype, the norm taken of the float32 sum."""
    total = partials.float().sum(0) + residual.float()
    normed = total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.float()).to(residual.dtype), total.to(residual.dtype)


def add_rms_norm_partials(partials: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                          eps: float, num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(sum(partials) + residual), the new residual), in one launch; ``residual`` is updated in place.
    ``num_warps``: a program's (one row's) warps (scripts/gpu_small_kernels.py sweeps it)."""
    from core.kernels.cuda.split_k_triton import add_rms_norm_partials_kernel

    splits, rows, width = partials.shape
    assert residual.shape == (rows, width) and residual.is_contiguous() and partials.is_contiguous()
    out = torch.empty_like(residual)
    if rows:
        add_rms_norm_partials_kernel[(rows,)](partials, residual, weight, out, rows, eps, SPLITS=splits, WIDTH=width,
                                              BLOCK=next_pow2(width), num_warps=num_warps)
    return out, residual
