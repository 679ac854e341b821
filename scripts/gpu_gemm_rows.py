"""cuBLAS's bf16 GEMMs at a decode step's row counts on the Qwen3-0.6B shapes: how close each linear comes to
reading its weight at the copy rate, and whether a pre-transposed weight (x @ W^T made contiguous) picks a better
kernel than F.linear's x W^T.

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


def main() -> None:
    torch.manual_seed(0)
    print("linear rows: F.linear us | x @ W^T contiguous us | weight read TB/s | TFLOP/s (F.linear)")
    step = {rows: [0.0, 0.0] for rows in ROWS}
    for rows in ROWS:
        for name, (out_features, in_features) in SHAPES.items():
            weights = [torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16)
                       for _ in range(COPIES)]
            transposed = [w.t().contiguous() for w in weights]
            x = torch.randn(rows, in_features, device="cuda", dtype=torch.bfloat16)
            linear = replay_us(lambda i: F.linear(x, weights[i]))
            mm = replay_us(lambda i: torch.mm(x, transposed[i]))
            times = LAYERS if name != "lm_head" else 1
            step[rows][0] += linear * times
            step[rows][1] += mm * times
            size = out_features * in_features
            print(f"{name:8s} {rows:4d}: {linear:7.1f} | {mm:7.1f} | {2 * size / linear / 1e6:5.2f} | "
                  f"{2 * rows * size / linear / 1e6:6.1f}", flush=True)
    for rows, (linear, mm) in step.items():
        print(f"rows {rows}: a step's linears {linear / 1e3:.3f} ms with F.linear, {mm / 1e3:.3f} ms transposed")


if __name__ == "__main__":
    main()
