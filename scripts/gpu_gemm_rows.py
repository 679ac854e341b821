"""cuBLAS's bf16 GEMMs at a decode step's row counts on the Qwen3-0.6B shapes: how close each linear comes to
reading its weight at the copy rate, through torch's default cuBLAS path and through cuBLASLt
(``torch.backends.cuda.preferred_blas_library``), whose heuristics may pick other kernels (split-K) for the narrow
linears. (A pre-transposed weight, x @ W^T made contiguous, was measured too and picked no better kernel.)

    . scripts/gpu_env.sh && python3 scripts/gpu_gemm_rows.py [--rows 8,32,64,128,256]

``--split-k`` times instead each linear cut over its inputs into 2, 4 or 8 slices as one strided batched GEMM
(core/kernels/split_k.py), with bf16 or float32 partials, and the add+RMSNorm that sums them against flashinfer's
fused_add_rmsnorm on the plain product: what a split-K narrow linear would save a layer.

Each figure is the median of ten CUDA-graph replays of 20 products, four weight copies taken in turn so that the
reads come from HBM rather than L2; the last lines sum a step's linears (28 layers and the LM head).
"""

from __future__ import annotations

import sys
from typing import Callable

import torch
import torch.nn.functional as F

LAYERS = 28
SHAPES = {"qkv": (4096, 1024), "o_proj": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072),
          "lm_head": (151936, 1024)}  # [out, in]
ROWS = (8, 32, 64, 128, 256)
COPIES = 4
PER_REPLAY = 20


def replay_us(product: Callable[[int], object], copies: int = COPIES) -> float:
    """Median microseconds of one product, from graphs of PER_REPLAY products over ``copies`` weight copies in
    turn (``product(i)`` uses copy i)."""
    for i in range(copies):
        product(i)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        for i in range(PER_REPLAY):
            product(i % copies)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / PER_REPLAY)
    return sorted(times)[len(times) // 2]


def linear_us(x: torch.Tensor, weights: list[torch.Tensor], library: str) -> float:
    torch.backends.cuda.preferred_blas_library(library)
    try:
        return replay_us(lambda i: F.linear(x, weights[i]))
    finally:
        torch.backends.cuda.preferred_blas_library("cublas")


SPLITS = (2, 4, 8)


def split_k_main() -> None:
    from flashinfer.norm import fused_add_rmsnorm

    from core.kernels.split_k import add_rms_norm_partials, split_k_linear

    print("linear rows: cuBLAS us | split-K bf16 partials S=2/4/8 | float32 partials S=2/4/8; "
          "then flashinfer add+RMSNorm us | the partials' add+RMSNorm, bf16 / float32, S=2/4/8")
    for rows in ROWS:
        for name, (out_features, in_features) in SHAPES.items():
            if name == "lm_head":
                continue
            weights = [torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16)
                       for _ in range(COPIES)]
            x = torch.randn(rows, in_features, device="cuda", dtype=torch.bfloat16)
            plain = replay_us(lambda i: F.linear(x, weights[i]))
            cells = {}
            for dtype in (torch.bfloat16, torch.float32):
                for splits in SPLITS:
                    try:
                        cells[dtype, splits] = replay_us(lambda i: split_k_linear(x, weights[i], splits, dtype))
                    except Exception as error:  # a torch without bmm's out_dtype
                        print(f"  {name} {rows} S={splits} {dtype}: {type(error).__name__}: {error}"[:160])
                        cells[dtype, splits] = float("nan")
            line = " / ".join(f"{cells[torch.bfloat16, s]:5.1f}" for s in SPLITS)
            line32 = " / ".join(f"{cells[torch.float32, s]:5.1f}" for s in SPLITS)
            print(f"{name:8s} {rows:4d}: {plain:6.1f} | {line} | {line32}", flush=True)
        width = SHAPES["o_proj"][0]
        residual = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
        norm_weight = torch.ones(width, device="cuda", dtype=torch.bfloat16)
        y = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
        fused = replay_us(lambda i: fused_add_rmsnorm(y, residual, norm_weight, 1e-6))
        cells = []
        for dtype in (torch.bfloat16, torch.float32):
            for splits in SPLITS:
                partials = torch.randn(splits, rows, width, device="cuda", dtype=dtype)
                cells.append(replay_us(lambda i: add_rms_norm_partials(partials, residual, norm_weight, 1e-6)))
        print(f"add+RMSNorm {rows:4d}: {fused:5.1f} | " + " / ".join(f"{c:5.1f}" for c in cells), flush=True)


def main() -> None:
    torch.manual_seed(0)
    global ROWS
    if "--rows" in sys.argv:
        ROWS = tuple(int(r) for r in sys.argv[sys.argv.index("--rows") + 1].split(","))
    if "--split-k" in sys.argv:
        split_k_main()
        return
    print("linear rows: cuBLAS us | cuBLASLt us | weight read TB/s, cuBLAS / cuBLASLt")
    step = {rows: [0.0, 0.0] for rows in ROWS}
    for rows in ROWS:
        for name, (out_features, in_features) in SHAPES.items():
            weights = [torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16)
                       for _ in range(COPIES)]
            x = torch.randn(rows, in_features, device="cuda", dtype=torch.bfloat16)
            plain, lt = linear_us(x, weights, "cublas"), linear_us(x, weights, "cublaslt")
            times = LAYERS if name != "lm_head" else 1
            step[rows][0] += plain * times
            step[rows][1] += lt * times
            size = out_features * in_features
            print(f"{name:8s} {rows:4d}: {plain:7.1f} | {lt:7.1f} | {2 * size / plain / 1e6:5.2f} / "
                  f"{2 * size / lt / 1e6:5.2f}", flush=True)
    for rows, (plain, lt) in step.items():
        print(f"rows {rows}: a step's linears {plain / 1e3:.3f} ms through cuBLAS, {lt / 1e3:.3f} ms through cuBLASLt")


if __name__ == "__main__":
    main()
