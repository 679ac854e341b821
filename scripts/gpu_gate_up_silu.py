"""The MLP's gate_up linear with SiLU-and-mul folded into one Triton kernel (core/kernels/gate_up_silu.py) against
what a decode step runs now: cuBLAS's gate_up GEMM, then flashinfer's SiLU-and-mul, on the Qwen3-0.6B shape.

For each row count, the two steps and the fused kernel at each tile of a small sweep, checked against the two steps
first; medians of CUDA-graph replays over four weight copies taken in turn (reads from HBM, not L2:
scripts/gpu_gemm_rows.py's ``replay_us``). The last column is what the best tile would save a decode step over 28
layers (negative: a loss). The kernel is wired into the engine only if it wins at the row counts the workload
spends its steps at (docs/BENCHMARKS.md).

    . scripts/gpu_env.sh && python3 scripts/gpu_gate_up_silu.py [--rows 32,64,128,192,256]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from core.kernels.gate_up_silu import GateUpTile, gate_up_silu
from gpu_gemm_rows import COPIES, LAYERS, replay_us  # beside this script: Python puts a script's folder on its path

HIDDEN, INTERMEDIATE = 1024, 3072
TILES = [GateUpTile(m, n, k, warps, stages) for m, n, k, warps, stages in (
    (16, 64, 64, 4, 3), (32, 64, 64, 4, 3), (64, 64, 64, 4, 3), (64, 128, 64, 4, 3), (64, 64, 128, 4, 3),
    (128, 64, 64, 4, 3), (64, 32, 128, 4, 4), (32, 128, 64, 4, 4), (64, 128, 64, 8, 3), (128, 128, 64, 8, 3))]


def two_steps(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    from flashinfer.activation import silu_and_mul

    return silu_and_mul(F.linear(x, weight))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="32,64,128,192,256")
    args = parser.parse_args()
    torch.manual_seed(0)
    weights = [torch.randn(2 * INTERMEDIATE, HIDDEN, device="cuda", dtype=torch.bfloat16) / HIDDEN ** 0.5
               for _ in range(COPIES)]
    print("rows: cuBLAS + SiLU-and-mul us | fused, each tile (m/n/k/warps/stages) us | best | a step's saving us")
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
        reference = two_steps(x, weights[0])
        base = replay_us(lambda i: two_steps(x, weights[i]))
        cells = {}
        for tile in TILES:
            if tile.block_m > max(16, 2 * rows):
                continue
            try:
                got = gate_up_silu(x, weights[0], tile)
            except Exception as error:  # a tile this GPU's shared memory cannot hold
                print(f"  {tile}: {type(error).__name__}: {str(error)[:120]}")
                continue
            diff = (got.float() - reference.float()).abs().max().item()
            if diff > 0.05:
                print(f"  {tile}: max difference {diff:.3f} against the two steps; not timed")
                continue
            cells[tile] = replay_us(lambda i: gate_up_silu(x, weights[i], tile))
        if not cells:
            print(f"{rows:4d}: {base:6.1f} | no tile ran")
            continue
        best = min(cells, key=cells.get)
        line = " ".join(f"{t.block_m}/{t.block_n}/{t.block_k}/{t.num_warps}/{t.num_stages}={us:.1f}"
                        for t, us in cells.items())
        print(f"{rows:4d}: {base:6.1f} | {line} | {cells[best]:.1f} | {(base - cells[best]) * LAYERS:+.0f}",
              flush=True)


if __name__ == "__main__":
    main()
