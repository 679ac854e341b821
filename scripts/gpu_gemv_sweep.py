"""Batch-1 linears on the GPU: cuBLAS against the Triton kernels of core/kernels/gemv.py, for each linear of the
Qwen3-0.6B shape, with a sweep over tile sizes.

Run on a CUDA machine after ``. scripts/gpu_env.sh``:

    python3 scripts/gpu_gemv_sweep.py --out $OUT

Each figure is the device time of one call inside a CUDA graph of back-to-back calls that cycle through 16
copies of the weight (more than L2 holds): what a call costs inside a captured decode step, weights read from
HBM as the model reads them. The sweep's kernels are compiled first by a pool of processes (Triton compiles
on the CPU, one kernel at a time per process); the timing runs in this process from Triton's disk cache.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F

from core.kernels.gemv import NORM, SILU_MUL, GemvConfig, gemv, gemv_config, rms_norm_gemv, silu_mul_gemv
from gpu_profile import graph_time_us  # beside this script: Python puts a script's folder on its path

ROOT = Path(__file__).resolve().parents[1]  # where the output folder goes by default

# name -> (out features, in features) of Qwen3-0.6B's linears
SHAPES = {"qkv_proj": (4096, 1024), "o_proj": (1024, 2048), "gate_up_proj": (6144, 1024), "down_proj": (1024, 3072)}
COPIES = 16
SWEEP = [GemvConfig(n, k, w) for n, k, w in itertools.product((1, 2, 4, 8, 16), (256, 512, 1024), (2, 4, 8))]


def _weights(out_f: int, in_f: int) -> list[torch.Tensor]:
    return [torch.randn(out_f, in_f, dtype=torch.bfloat16, device="cuda") * in_f ** -0.5 for _ in range(COPIES)]


def _compile(jobs: list[tuple[int, int, GemvConfig]]) -> int:
    """Compile each (out, in, config) by calling it once; the binaries land in Triton's cache."""
    for out_f, in_f, cfg in jobs:
        x = torch.randn(1, in_f, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(out_f, in_f, dtype=torch.bfloat16, device="cuda")
        gemv(x, w, None, cfg)
    torch.cuda.synchronize()
    return len(jobs)


def precompile(workers: int) -> None:
    jobs = [(*shape, cfg) for shape in SHAPES.values() for cfg in SWEEP]
    chunks = [jobs[i::workers] for i in range(workers)]
    import multiprocessing

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = sum(pool.map(_compile, chunks))
    print(f"compiled {done} kernel variants with {workers} processes", flush=True)


def sweep(out_f: int, in_f: int) -> list[tuple[float, GemvConfig]]:
    weights = _weights(out_f, in_f)
    x = torch.randn(1, in_f, dtype=torch.bfloat16, device="cuda")
    results = [(graph_time_us(lambda i, c=cfg: gemv(x, weights[i], None, c), COPIES), cfg) for cfg in SWEEP]
    return sorted(results, key=lambda r: r[0])


def sweep_folded(out_f: int, in_f: int, prologue: int) -> list[tuple[float, GemvConfig]]:
    """The variants with a prologue: the folded norm reads the whole row in one chunk (only block_n and the
    warps vary); SiLU-and-mul reads two inputs per column."""
    weights = _weights(out_f, in_f)
    x, res = (torch.randn(1, in_f, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    gate_up = torch.randn(1, 2 * in_f, dtype=torch.bfloat16, device="cuda")
    gain = torch.ones(in_f, dtype=torch.bfloat16, device="cuda")
    block_ks = (gemv_config(out_f, in_f, NORM).block_k,) if prologue == NORM else (512, 1024)
    configs = [GemvConfig(n, k, w) for n, k, w in itertools.product((1, 2, 4, 8), block_ks, (2, 4, 8))]

    def call(i: int, cfg: GemvConfig) -> None:
        if prologue == NORM:
            rms_norm_gemv(x, res, gain, 1e-6, weights[i], None, cfg)
        else:
            silu_mul_gemv(gate_up, weights[i], cfg)

    results = [(graph_time_us(lambda i, c=cfg: call(i, c), COPIES), cfg) for cfg in configs]
    return sorted(results, key=lambda r: r[0])


def compare(name: str, out_f: int, in_f: int, best: GemvConfig | None) -> str:
    """cuBLAS, the default tiles and the best swept tiles; the norm and activation folded in or not."""
    from flashinfer.activation import silu_and_mul
    from flashinfer.norm import fused_add_rmsnorm

    weights = _weights(out_f, in_f)
    mb = out_f * in_f * 2 / 1e6
    x = torch.randn(1, in_f, dtype=torch.bfloat16, device="cuda")
    parts = [f"{name} ({mb:.1f} MB)"]

    def add(label: str, us: float) -> None:
        parts.append(f"{label} {us:.2f} us ({mb / us:.2f} TB/s)")

    add("cublas", graph_time_us(lambda i: F.linear(x, weights[i]), COPIES))
    add("gemv", graph_time_us(lambda i: gemv(x, weights[i]), COPIES))
    if best is not None and best != gemv_config(out_f, in_f):
        add(f"gemv{best}", graph_time_us(lambda i: gemv(x, weights[i], None, best), COPIES))
    if name in ("qkv_proj", "gate_up_proj"):
        res = torch.randn_like(x)
        gain = torch.ones(in_f, dtype=torch.bfloat16, device="cuda")

        def separate(i: int) -> None:
            fused_add_rmsnorm(x, res, gain, 1e-6)
            F.linear(x, weights[i])

        add("add+norm,cublas", graph_time_us(separate, COPIES))
        add("add+norm folded", graph_time_us(lambda i: rms_norm_gemv(x, res, gain, 1e-6, weights[i]), COPIES))
    if name == "down_proj":
        gate_up = torch.randn(1, 2 * in_f, dtype=torch.bfloat16, device="cuda")
        add("silu_mul,cublas", graph_time_us(lambda i: F.linear(silu_and_mul(gate_up), weights[i]), COPIES))
        add("silu_mul folded", graph_time_us(lambda i: silu_mul_gemv(gate_up, weights[i]), COPIES))
    return ", ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "out" / "gemv"))
    parser.add_argument("--workers", type=int, default=14)
    parser.add_argument("--no-sweep", action="store_true", help="only compare cuBLAS with the default tiles")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    best: dict[str, GemvConfig] = {}
    if not args.no_sweep:
        precompile(args.workers)
        for name, (out_f, in_f) in SHAPES.items():
            ranked = sweep(out_f, in_f)
            best[name] = ranked[0][1]
            default = gemv_config(out_f, in_f)
            default_us = next(us for us, cfg in ranked if cfg == default)
            top = ", ".join(f"{cfg.block_n}/{cfg.block_k}/{cfg.num_warps} {us:.2f}" for us, cfg in ranked[:5])
            say(f"sweep {name}: best (block_n/block_k/warps us) {top}; default {default} {default_us:.2f} us")
            folded = {"qkv_proj": NORM, "gate_up_proj": NORM, "down_proj": SILU_MUL}.get(name)
            if folded is not None:
                ranked = sweep_folded(out_f, in_f, folded)
                top = ", ".join(f"{cfg.block_n}/{cfg.block_k}/{cfg.num_warps} {us:.2f}" for us, cfg in ranked[:5])
                say(f"sweep {name} with the {'norm' if folded == NORM else 'SiLU-and-mul'} folded in: best {top}; "
                    f"default {gemv_config(out_f, in_f, folded)}")
    for name, (out_f, in_f) in SHAPES.items():
        say(compare(name, out_f, in_f, best.get(name)))
    (out / "gemv_sweep.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
