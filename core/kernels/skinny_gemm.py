"""Linears for a few rows on CUDA (decode batches of 2 to ``SKINNY_MAX_ROWS``): one Triton kernel that holds
every row and streams each weight once through tensor-core products, with the RMSNorm (and residual add) or the
SiLU-and-mul before it folded in, as core/kernels/gemv.py does for one row.

A decode step of a few rows reads each weight once and does little else: its linears should run at the copy
rate. cuBLAS runs the Qwen3-0.6B shapes at 8-64 rows far below it (scripts/gpu_gemm_rows.py on an H200:
o_proj and down, 1,024 outputs each, at 0.6-1.05 TB/s: too few output tiles for 132 SMs), and the norms and
the activation between the linears are launches of their own. Here a program owns ``BLOCK_N`` output features
and all the rows: with 16 features a program, a 1,024-wide output is 64 programs each streaming its slice.

The arithmetic follows the separate kernels, as the GEMV's does: sums in float32, the residual sum rounded to
the model's dtype, the prologue's output rounded to the dtype once before the product, the product accumulated
in float32. Each row's result depends on that row alone (the tile's other rows are other products), so a
request gets the same bits whatever the batch around it, up to ``SKINNY_MAX_ROWS``. Triton is imported lazily
(core/kernels/triton_available.py says whether it can run).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from core.arith import ceil_div, next_pow2
from core.kernels.gemv import NORM, PLAIN, SILU_MUL

SKINNY_MAX_ROWS = 64
SKINNY_MAX_OUT = 8192  # wider linears (an LM head) stay on cuBLAS, which reads them near the copy rate

__all__ = ["SKINNY_MAX_OUT", "SKINNY_MAX_ROWS", "SkinnyConfig", "skinny_config", "skinny_linear",
           "skinny_rms_norm_linear", "skinny_silu_mul_linear"]


@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    block_m: int = 64  # the most rows a program holds (a tile holds at least 16: a tensor-core product's least)

    def rows_per_program(self, rows: int) -> int:
        return max(16, min(next_pow2(rows), self.block_m))


def skinny_config(rows: int, out_features: int, in_features: int, prologue: int = PLAIN) -> SkinnyConfig:
    """Tile sizes for a ``[rows, in] x [out, in]^T`` product."""
    return SkinnyConfig(16, min(next_pow2(in_features), 128), 4, 4)


def fits(rows: int, out_features: int) -> bool:
    """Whether the kernel takes a product of ``rows`` rows into ``out_features`` outputs."""
    return 2 <= rows <= SKINNY_MAX_ROWS and out_features <= SKINNY_MAX_OUT


@functools.cache
def _kernel():
    from core.kernels.skinny_gemm_triton import skinny_gemm_kernel  # imports triton

    return skinny_gemm_kernel


def _launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, prologue: int,
            residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
            config: SkinnyConfig | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    rows = x.shape[0]
    out_features, in_features = weight.shape
    if rows > SKINNY_MAX_ROWS:
        raise ValueError(f"the skinny GEMM takes up to {SKINNY_MAX_ROWS} rows, got {rows}")
    x = x.contiguous()
    out = torch.empty(rows, out_features, dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else None
    cfg = config or skinny_config(rows, out_features, in_features, prologue)
    block_m = cfg.rows_per_program(rows)
    unused = weight  # a valid pointer for the arguments a variant does not read
    _kernel()[(ceil_div(out_features, cfg.block_n), ceil_div(rows, block_m))](
        x, residual.contiguous() if residual is not None else x, res_out if res_out is not None else unused,
        norm_weight if norm_weight is not None else unused, eps, weight, bias if bias is not None else unused,
        out, rows, out_features, K=in_features, X_STRIDE=x.shape[1], PROLOGUE=prologue,
        HAS_RESIDUAL=residual is not None, HAS_BIAS=bias is not None, BLOCK_M=block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",  # tf32: unused for bf16
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out, res_out


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  config: SkinnyConfig | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` for a few rows x; weight is a contiguous [out, in]."""
    return _launch(x, weight, bias, PLAIN, config=config)[0]


def skinny_rms_norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                           weight: torch.Tensor, bias: torch.Tensor | None = None,
                           config: SkinnyConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(linear(rms_norm(h)), h)`` with ``h = x + residual`` (or ``x`` when there is no residual yet); the
    returned residual is a new tensor (or ``x`` itself): the inputs are left as they were."""
    out, res_out = _launch(x, weight, bias, NORM, residual, norm_weight, eps, config)
    return out, res_out if res_out is not None else x


def skinny_silu_mul_linear(gate_up: torch.Tensor, weight: torch.Tensor,
                           config: SkinnyConfig | None = None) -> torch.Tensor:
    """``linear(silu(gate) * up)`` where ``gate_up`` is ``[rows, 2 * in]``, gate first."""
    return _launch(gate_up, weight, None, SILU_MUL, config=config)[0]
