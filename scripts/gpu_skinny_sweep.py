"""A decode step's layer linears at a few rows: cuBLAS with flashinfer's norm or activation kernel before it,
against the skinny GEMM (core/kernels/skinny_gemm.py) with the norm or activation folded in, over its tiles.

    . scripts/gpu_env.sh && python3 scripts/gpu_skinny_sweep.py [--rows 8,32,64,128,256] [--json OUT.json]

Each figure is the median of ten CUDA-graph replays of one product per layer over 28 layers' own weights (so
the weights come from HBM, as in a step), in microseconds a layer; "unfolded" is flashinfer's norm or
activation kernel, then the skinny GEMM's plain product on the same tiles. A line per row count sums a step's
four linears: cuBLAS's way, the skinny GEMM's best tiles, and the better of folded and unfolded per linear.
"""

from __future__ import annotations

import argparse
import itertools
import json
from typing import Callable

import torch
import torch.nn.functional as F

from core.kernels.gemv import NORM, PLAIN, SILU_MUL
from core.kernels.skinny_gemm import SkinnyConfig, _launch

LAYERS = 28
HIDDEN, EPS = 1024, 1e-6
SHAPES = {"qkv": (4096, 1024, NORM), "o_proj": (1024, 2048, PLAIN), "gate_up": (6144, 1024, NORM),
          "down": (1024, 3072, SILU_MUL)}  # [out, in], the prologue folded in


def replay_us(products: Callable[[], None]) -> float:
    """Median microseconds a layer of a graph of ``products`` (one per layer)."""
    products()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        products()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / LAYERS)
    return sorted(times)[len(times) // 2]


def candidates(rows: int) -> list[SkinnyConfig]:
    if rows <= 64:
        tiles = itertools.product((16, 32, 64), (128, 256), (3, 4))
        return [SkinnyConfig(n, k, 4, stages, block_m=64) for n, k, stages in tiles]
    return [SkinnyConfig(n, k, 4 if m == 64 else 8, 3, block_m=m)
            for m, n, k in itertools.product((64, 128), (32, 64), (64, 128))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="8,32,64,128,256")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from flashinfer.activation import silu_and_mul
    from flashinfer.norm import fused_add_rmsnorm

    torch.manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    gain = 1 + 0.1 * torch.randn(HIDDEN, **bf)
    results = {}
    for rows in map(int, args.rows.split(",")):
        step = {"cublas": 0.0, "skinny": 0.0, "apart": 0.0}
        for name, (out_features, in_features, prologue) in SHAPES.items():
            weights = [torch.randn(out_features, in_features, **bf) * in_features ** -0.5 for _ in range(LAYERS)]
            width = 2 * in_features if prologue == SILU_MUL else in_features
            x, residual = torch.randn(rows, width, **bf), torch.randn(rows, width, **bf)

            def baseline():
                for w in weights:
                    if prologue == NORM:
                        fused_add_rmsnorm(x, residual, gain, EPS)
                        F.linear(x, w)
                    elif prologue == SILU_MUL:
                        F.linear(silu_and_mul(x), w)
                    else:
                        F.linear(x, w)

            def skinny(cfg):
                def run():
                    for w in weights:
                        _launch(x, w, None, prologue, residual if prologue == NORM else None,
                                gain if prologue == NORM else None, EPS, cfg)
                return run

            def unfolded(cfg):  # the norm or the activation as flashinfer's kernel, then the skinny GEMM
                def run():
                    for w in weights:
                        if prologue == NORM:
                            fused_add_rmsnorm(x, residual, gain, EPS)
                        _launch(silu_and_mul(x) if prologue == SILU_MUL else x, w, None, PLAIN, config=cfg)
                return run

            base = replay_us(baseline)
            timed = sorted((replay_us(skinny(cfg)), cfg) for cfg in candidates(rows))
            best_us, best = timed[0]
            apart = replay_us(unfolded(best)) if prologue != PLAIN else best_us
            step["cublas"] += base * LAYERS
            step["skinny"] += best_us * LAYERS
            step["apart"] += min(best_us, apart) * LAYERS
            results[f"{name}@{rows}"] = dict(cublas_us=base, skinny_us=best_us, unfolded_us=apart,
                                             best=best.__dict__, all=[(t, c.__dict__) for t, c in timed])
            print(f"{name:8s} {rows:4d}: cuBLAS {base:6.1f} us | skinny {best_us:6.1f} us ({best}) | unfolded "
                  f"{apart:6.1f} | TB/s {2 * out_features * in_features / base / 1e6:4.2f} / "
                  f"{2 * out_features * in_features / best_us / 1e6:4.2f}", flush=True)
        print(f"rows {rows}: a step's layer linears {step['cublas'] / 1e3:.3f} ms (cuBLAS + norms) against "
              f"{step['skinny'] / 1e3:.3f} ms (skinny, best tiles), {step['apart'] / 1e3:.3f} ms folding only where it "
              "pays", flush=True)
    if args.json:
        json.dump(results, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
