"""The C GEMM (core/kernels/cpu_gemm.py) at a decode step's row counts on SmolLM2-135M's linears: each of the 30
layers' QKV, o_proj, gate_up and down once, in the forward pass's order, on random weights in the embedded GGUF's
form (4-bit codes times a float16 scale plus an offset per block of 32 inputs), held as float32 panels and as the
4-bit panels the engine uses, beside torch's own ``F.linear`` on the float32 weight.

    .venv/bin/python scripts/cpu_gemm_rows.py [--rows 1,4,8,12,16,20,24,32,64] [--threads 2] [--repeats 5]

Each figure is the best of ``--repeats`` passes over all 120 weights (about 0.4 GB in float32, so the float32
panels come from memory; the 4-bit ones, 70 MB, partly from a large last-level cache), in milliseconds and GFLOP/s
(two FLOPs a weight and row). Run it on a quiet machine, alternating with another build to compare two versions.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from core.kernels.cpu_features import cpu_features
from core.kernels.cpu_gemm import PanelWeight, load_library, unsupported_reason

LAYERS = 30
SHAPES = {"qkv": (832, 576), "o_proj": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}  # [out, in]


def four_bit_weight(out_features: int, in_features: int, gen: torch.Generator) -> tuple[torch.Tensor, tuple]:
    """A float32 weight made of 4-bit codes, and those codes with each block's d and m (four_bit.py's form)."""
    codes = torch.randint(0, 16, (out_features, in_features), dtype=torch.uint8, generator=gen)
    d = (torch.rand(out_features, in_features // 32, generator=gen) * 0.01).half().float()
    m = -torch.rand(out_features, in_features // 32, generator=gen) * 0.05
    weight = torch.addcmul(m.repeat_interleave(32, 1), codes.float(), d.repeat_interleave(32, 1))
    return weight, (codes, d, m)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,4,8,12,16,20,24,32,64")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    reason = unsupported_reason(cpu_features().flags) or load_library().reason
    if reason:
        raise SystemExit(f"cpu_gemm_rows: {reason}")
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    weights = []
    for _ in range(LAYERS):
        for out_features, in_features in SHAPES.values():
            weight, codes = four_bit_weight(out_features, in_features, gen)
            weights.append((weight, PanelWeight.of(weight, args.threads),
                            PanelWeight.of(weight, args.threads, codes)))
    flops_per_row = 2 * LAYERS * sum(o * i for o, i in SHAPES.values())
    forms = {"torch F.linear": lambda w, x: F.linear(x, w[0]), "float32 panels": lambda w, x: w[1].linear(x),
             "4-bit panels": lambda w, x: w[2].linear(x)}
    print(f"{'rows':>5} " + " ".join(f"{name:>24}" for name in forms))
    for rows in (int(r) for r in args.rows.split(",")):
        inputs = {i: torch.randn(rows, i, generator=gen) for _, i in SHAPES.values()}
        cells = []
        for run in forms.values():
            best = float("inf")
            for _ in range(args.repeats):
                start = time.perf_counter()
                for w in weights:
                    run(w, inputs[w[0].shape[1]])
                best = min(best, time.perf_counter() - start)
            cells.append(f"{best * 1e3:8.2f} ms {flops_per_row * rows / best / 1e9:6.1f} GF/s")
        print(f"{rows:>5} " + " ".join(f"{c:>24}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
