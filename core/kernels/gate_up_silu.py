"""The MLP's gate_up linear with its SiLU-and-mul in the same kernel: ``silu(x @ W_gate.T) * (x @ W_up.T)``.

Why it may pay: a decode step runs, per layer, the gate_up GEMM (writing [rows, 2 * intermediate]), then
flashinfer's SiLU-and-mul (reading all of that back, writing half): one launch and one round trip of the
activations more than the product needs, about 3 us of a layer at 256 rows on an H200 where the whole step's
non-attention work is about 20 us a layer. This kernel computes a tile of gate and the matching tile of up side by
side (the fused weight's rows n and intermediate + n, no new layout) and writes only the activation.

Not wired into the engine: whether a Triton tile GEMM holds cuBLAS's pace at these shapes is measured first
(``scripts/gpu_gate_up_silu.py``). Each product is rounded to the output's dtype before the activation, as the
unfused path's GEMM output is; the sums run in another order than cuBLAS's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GateUpTile:
    """A program's block of rows, of intermediate features and of the inputs it steps through; Triton's warps and
    pipeline stages."""

    block_m: int = 64
    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3


def default_tile(rows: int) -> GateUpTile:
    """Row blocks no taller than the batch needs (a tensor-core product takes 16 rows at the least)."""
    return GateUpTile(block_m=16 if rows <= 16 else 32 if rows <= 32 else 64)


@functools.cache
def _kernel():
    from core.kernels.gate_up_silu_triton import gate_up_silu_kernel  # imports triton

    return gate_up_silu_kernel


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor, tile: GateUpTile | None = None) -> torch.Tensor:
    """x: [rows, hidden]; weight: the fused gate_up weight [2 * intermediate, hidden] (gate rows, then up rows).
    Returns [rows, intermediate] in x's dtype."""
    rows, hidden = x.shape
    if weight.shape[1] != hidden or weight.shape[0] % 2:
        raise ValueError(f"a gate_up weight of shape {tuple(weight.shape)} does not take {hidden} inputs")
    if x.stride(1) != 1 or not weight.is_contiguous():
        raise ValueError("gate_up_silu reads rows of x and of the weight as contiguous runs")
    intermediate = weight.shape[0] // 2
    out = torch.empty(rows, intermediate, dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    tile = tile or default_tile(rows)
    grid = (-(-rows // tile.block_m), -(-intermediate // tile.block_n))
    _kernel()[grid](x, weight, out, rows, x.stride(0), out.stride(0), K=hidden, INTERMEDIATE=intermediate,
                    BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
                    DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                    num_warps=tile.num_warps, num_stages=tile.num_stages)
    return out
