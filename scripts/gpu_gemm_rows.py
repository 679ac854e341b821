"""cuBLAS's bf16 GEMMs at a decode step's row counts on the Qwen3-0.6B shapes: how close each linear comes to
reading its weight at the copy rate, through torch's default cuBLAS path and through cuBLASLt
(``torch.backends.cuda.preferred_blas_library``), whose heuristics may pick other kernels (split-K) for the narrow
linears. (A pre-transposed weight, x @ W^T made contiguous, was measured too and picked no better kernel.)

    . scripts/gpu_env.sh && python3 scripts/gpu_gemm_rows.py

Each figure is the median of ten CUDA-graph replays of 20 products, four weight copies taken in turn so that the
reads come from HBM rather than L2; the last lines sum a step's linears (28 layers and the LM head).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

LAYERS = 28
SHAPES = {"qkv": (4096, 1024), "o_proj": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072),
          "lm_head": (151936, 1024)}  # [out, in]
ROWS = (8, 32, 64, 128, 256)
COPIES = 4
PER_REPLAY = 20


def replay_us(product: Callable[[int], torch.Tensor]) -> float:
    """Median microseconds of one product, from graphs of PER_REPLAY products over the weight copies in turn."""
    for i in range(COPIES):
        product(i)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        for i in range(PER_REPLAY):
            product(i % COPIES)
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


def main() -> None:
    torch.manual_seed(0)
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
