"""Linears for one row on CUDA (decode at batch 1): one Triton kernel that streams each weight once, with the
RMSNorm (and residual add) before it, or the SiLU-and-mul before it, folded in.

At batch 1 a linear is a matrix-vector product and reading the weight is all its work. cuBLAS reads small
shapes' weights well under the copy rate (few, large tiles leave SMs idle), and the norms and the activation
between them are launches of their own. Here a program owns ``BLOCK_N`` output features: it streams those
weight rows once, ``BLOCK_K`` columns at a time, and many programs keep every SM's loads in flight.

The folded prologues are cheap because the input row is tiny (a few KB, served from L2):

* ``NORM``: the program reads the whole row in one chunk, so its mean square is at hand before the product.
  With a residual, the sum ``x + residual`` is the layer's new residual stream; program 0 writes it out.
* ``SILU_MUL``: the input is a gate_up output ``[gate | up]``; each chunk is ``silu(gate) * up``.

The arithmetic follows the separate kernels: sums in float32, the residual sum rounded to the model's dtype,
the prologue's output rounded to the dtype once before the product, the product accumulated in float32.

Two or more rows stay on cuBLAS: a version of this kernel that multiplied each weight chunk with up to 8 rows
lost to cuBLAS from 2 rows on (docs/BENCHMARKS.md). Triton is imported lazily
(core/kernels/cuda/triton_available.py says whether it can run).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from core.arith import ceil_div, next_pow2

GEMV_MAX_ROWS = 1
PDL_MAX_WEIGHT_BYTES = 64 << 20  # larger weights launch plainly (see _launch)
PLAIN, NORM, SILU_MUL = 0, 1, 2

__all__ = ["GEMV_MAX_ROWS", "GemvConfig", "gemv", "gemv_config", "rms_norm_gemv", "silu_mul_gemv"]


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    num_warps: int


def gemv_config(out_features: int, in_features: int, prologue: int = PLAIN, pdl: bool = False) -> GemvConfig:
    """Tile sizes for a ``[1, in] x [out, in]^T`` product, the best of a sweep (docs/BENCHMARKS.md).

    Plain: two output features per program, chunks of up to 1024 columns, four warps (near the best tile for
    every Qwen3-0.6B linear). Folded norm: the whole row in one chunk and eight features per program: every
    program re-reads the input row and the residual, and with two features per program that re-reading cost as
    much L2 traffic as the weight itself. With ``pdl`` every program loads its weight rows in one chunk before it
    waits for the row (see the kernel), and the best tiles are larger: more of the weight is in flight while the
    kernel ahead finishes (gpu_profile.py's tile sweep with PDL).
    """
    whole_row = next_pow2(in_features)
    if pdl:
        return {NORM: GemvConfig(16, whole_row, 8), SILU_MUL: GemvConfig(4, whole_row, 8)}.get(
            prologue, GemvConfig(8, whole_row, 4))
    if prologue == NORM:
        return GemvConfig(8, whole_row, 4)
    return GemvConfig(2, min(whole_row, 1024), 4)


@functools.cache
def _kernel():
    from core.kernels.cuda.gemv_triton import gemv_kernel  # imports triton

    return gemv_kernel


def _launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, prologue: int,
            residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
            config: GemvConfig | None = None, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    if x.shape[0] != 1:
        raise ValueError(f"the GEMV kernel takes one row, got {x.shape[0]}")
    x = x.contiguous()
    out_features, in_features = weight.shape
    # an LM head's read (hundreds of MB) dwarfs the previous kernel's tail, and starting it early measured slower
    # (its early loads compete with the kernel ahead for the memory they both need)
    pdl = pdl and weight.numel() * weight.element_size() <= PDL_MAX_WEIGHT_BYTES
    out = torch.empty(1, out_features, dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else None
    cfg = config or gemv_config(out_features, in_features, prologue, pdl)
    if (prologue == NORM or pdl) and cfg.block_k < in_features:
        raise ValueError(f"a folded norm and PDL read the whole row: block_k {cfg.block_k} < {in_features} columns")
    unused = weight  # a valid pointer for the arguments a variant does not read
    _kernel()[(ceil_div(out_features, cfg.block_n),)](
        x, residual.contiguous() if residual is not None else x, res_out if res_out is not None else unused,
        norm_weight if norm_weight is not None else unused, eps, weight, bias if bias is not None else unused,
        out, out_features, K=in_features, PROLOGUE=prologue, HAS_RESIDUAL=residual is not None,
        HAS_BIAS=bias is not None, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PDL=pdl, num_warps=cfg.num_warps,
        **({"launch_pdl": True} if pdl else {}))
    return out, res_out


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         config: GemvConfig | None = None, pdl: bool = False) -> torch.Tensor:
    """``x @ weight.T + bias`` for one row x; weight is a contiguous [out, in]. ``pdl``: launched as a
    programmatic dependent launch (KernelChoices.pdl)."""
    return _launch(x, weight, bias, PLAIN, config=config, pdl=pdl)[0]


def rms_norm_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                  weight: torch.Tensor, bias: torch.Tensor | None = None,
                  config: GemvConfig | None = None, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(linear(rms_norm(h)), h)`` with ``h = x + residual`` (or ``x`` when there is no residual yet).

    The returned residual is a new tensor (or ``x`` itself): the inputs are left as they were."""
    out, res_out = _launch(x, weight, bias, NORM, residual, norm_weight, eps, config, pdl)
    return out, res_out if res_out is not None else x


def silu_mul_gemv(gate_up: torch.Tensor, weight: torch.Tensor,
                  config: GemvConfig | None = None, pdl: bool = False) -> torch.Tensor:
    """``linear(silu(gate) * up)`` where ``gate_up`` is ``[1, 2 * in]``, gate first."""
    return _launch(gate_up, weight, None, SILU_MUL, config=config, pdl=pdl)[0]
