"""The sampler's race (core/kernels/race.py) at decode row counts: exact scores against the screen (cheap scores
first, made exact), by columns a program and warps a program.

On an H200 the race took 150 us of a 256-row decode step in the nano-vllm workload (docs/BENCHMARKS.md, session 42's
budget), about 1.6% of the run, where reading the step's bf16 logits once takes about 20 us: this says whether the
kernel's shape or its arithmetic (a hash, two logarithms and an exact division for each of 39 million logits) is
what it waits on, and what the screen (race_chunks_kernel's SCREEN) saves. Medians of CUDA-graph replays
(scripts/gpu_gemm_rows.py's ``replay_us``); every variant's tokens are checked against the exact default's, which
they must equal (neither the shape nor the screen ever changes a token). ``--scale`` spreads the logits: 3 is
about what random weights give, 30 a trained model's peaked rows.

    . scripts/gpu_env.sh && python3 scripts/gpu_race.py [--rows 32,128,256] [--blocks 1024,2048,4096] [--scale 3]
"""

from __future__ import annotations

import argparse

import torch

from core.kernels.race import BLOCK, FEW_WARPS_FROM_ROWS, race_tokens
from gpu_gemm_rows import replay_us  # beside this script: Python puts a script's folder on its path

VOCAB = 151936  # Qwen3's
WARPS = (2, 4, 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="32,128,256")
    parser.add_argument("--blocks", default="1024,2048,4096")
    parser.add_argument("--scale", type=float, default=3.0, help="the logits' standard deviation")
    args = parser.parse_args()
    torch.manual_seed(0)
    blocks = [int(b) for b in args.blocks.split(",")]
    print(f"rows: us a step's race at columns a program x warps, exact / screened (default {BLOCK} x 2 from "
          f"{FEW_WARPS_FROM_ROWS} rows, else x 4, "
          "screened); the bf16 logits' read at the copy rate is about 20 us at 256 rows")
    for rows in (int(r) for r in args.rows.split(",")):
        logits = (torch.randn(rows, VOCAB, device="cuda") * args.scale).to(torch.bfloat16)
        temperatures = torch.full((rows,), 0.6, device="cuda")
        seeds = torch.randint(0, 2 ** 40, (rows,), device="cuda")
        positions = torch.randint(0, 2048, (rows,), device="cuda")
        reference = race_tokens(logits, temperatures, seeds, positions, screen=False)
        cells = []
        for block in blocks:
            for warps in WARPS:
                times = []
                for screen in (False, True):
                    def run(block=block, warps=warps, screen=screen):
                        return race_tokens(logits, temperatures, seeds, positions, block, warps, screen)
                    times.append(f"{replay_us(lambda i: run(), copies=1):.1f}" +
                                 ("" if torch.equal(run(), reference) else " (tokens differ!)"))
                cells.append(f"{block}x{warps} {' / '.join(times)}")
        print(f"{rows:3d}: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
