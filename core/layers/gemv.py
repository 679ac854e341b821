"""Linears for a few rows on CUDA: one Triton kernel that streams each weight once at memory speed, with the
RMSNorm (and residual add) before it, or the SiLU-and-mul before it, folded in.

At decode batch 1 a linear is a matrix-vector product and reading the weight is all its work. cuBLAS runs
the Qwen3-0.6B shapes at 1.2-1.6 TB/s on an H200 (~750 us of a 1.5 ms step), well under the memory's
~4.8 TB/s, and the norms and the activation between them are launches of their own. Here a program owns
``BLOCK_N`` output features for every row: it streams those weight rows once, ``BLOCK_K`` columns at a time,
and multiplies each chunk with all ``M`` input rows (``M <= GEMV_MAX_ROWS``). Enough programs are launched to
keep every SM's loads in flight.

The folded prologues are cheap because the input is tiny (a few KB per row, served from L2):

* ``NORM``: each program computes its rows' mean square itself, then normalises each chunk as it reads it.
  With a residual, the sum ``x + residual`` is the layer's new residual stream; program 0 writes it out.
* ``SILU_MUL``: the input is a gate_up output ``[gate | up]``; each chunk is ``silu(gate) * up``.

The arithmetic follows the separate kernels: sums in float32, the residual sum rounded to the model's dtype,
the prologue's output rounded to the dtype once before the product, the product accumulated in float32.
Triton is imported lazily; ``gemv_available`` says whether this path can run here.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from core.layers.fused_qkv import fused_qkv_available

GEMV_MAX_ROWS = 8  # past this many rows, a GEMM reads the weight once for all of them anyway
PLAIN, NORM, SILU_MUL = 0, 1, 2

__all__ = ["GEMV_MAX_ROWS", "GemvConfig", "gemv", "gemv_available", "gemv_config", "gemv_runs_on",
           "rms_norm_gemv", "silu_mul_gemv"]


def gemv_available() -> bool:
    """Whether Triton imports here (the same condition as the fused QKV kernel's)."""
    return fused_qkv_available()


def gemv_runs_on(x: torch.Tensor) -> bool:
    """A CUDA tensor, or a CPU one under Triton's interpreter (``TRITON_INTERPRET=1``, how the tests run it)."""
    return x.is_cuda or (x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    num_warps: int


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def gemv_config(rows: int, out_features: int, in_features: int) -> GemvConfig:
    """Tile sizes for a ``[rows, in] x [out, in]^T`` product.

    Chunks of up to 1024 columns; as few output features per program as keep about a thousand programs in
    flight (two rows of weight per program for the 1024-feature outputs of Qwen3-0.6B, eight for its 4096+).
    """
    block_k = min(_next_pow2(in_features), 1024)
    block_n = 1
    while block_n < 16 and out_features // (block_n * 2) >= 512:
        block_n *= 2
    return GemvConfig(block_n, block_k, 4)


@functools.cache
def _kernel():
    from core.layers.gemv_kernel import gemv_kernel  # imports triton

    return gemv_kernel


def _launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, prologue: int, in_features: int,
            residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
            config: GemvConfig | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    rows = x.shape[0]
    if x.stride(-1) != 1:
        x = x.contiguous()
    out_features = weight.shape[0]
    out = torch.empty(rows, out_features, dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else None
    if rows == 0:
        return out, res_out
    cfg = config or gemv_config(rows, out_features, in_features)
    unused = weight  # a valid pointer for the arguments a variant does not read
    res = residual if residual is not None else x
    _kernel()[(_cdiv(out_features, cfg.block_n),)](
        x, x.stride(0), res, res.stride(0), res_out if res_out is not None else unused,
        norm_weight if norm_weight is not None else unused, eps, weight, bias if bias is not None else unused,
        out, out.stride(0), out_features, M=rows, K=in_features, PROLOGUE=prologue,
        HAS_RESIDUAL=residual is not None, HAS_BIAS=bias is not None, BLOCK_M=_next_pow2(rows),
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps)
    return out, res_out


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         config: GemvConfig | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` for x of at most ``GEMV_MAX_ROWS`` rows; weight is a contiguous [out, in]."""
    return _launch(x, weight, bias, PLAIN, weight.shape[1], config=config)[0]


def rms_norm_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                  weight: torch.Tensor, bias: torch.Tensor | None = None,
                  config: GemvConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(linear(rms_norm(h)), h)`` with ``h = x + residual`` (or ``x`` when there is no residual yet).

    The returned residual is a new tensor (or ``x`` itself): the inputs are left as they were."""
    out, res_out = _launch(x, weight, bias, NORM, weight.shape[1], residual, norm_weight, eps, config)
    return out, res_out if res_out is not None else x


def silu_mul_gemv(gate_up: torch.Tensor, weight: torch.Tensor,
                  config: GemvConfig | None = None) -> torch.Tensor:
    """``linear(silu(gate) * up)`` where ``gate_up`` is ``[rows, 2 * in]``, gate first."""
    return _launch(gate_up, weight, None, SILU_MUL, weight.shape[1], config=config)[0]
