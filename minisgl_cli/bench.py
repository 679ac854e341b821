"""``minisgl bench``: the engine and transformers side by side on the same requests."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console

from core.bench import BASELINES, CUDA_BASELINES, BenchOptions, run_bench
from core.bench.workload import WORKLOADS


def bench(
    workload: Optional[str] = typer.Option(
        None, help=f"One of {', '.join(WORKLOADS)}; default 'cpu' without CUDA, else 'nanovllm'."),
    model: Optional[str] = typer.Option(
        None, help="Model directory, .gguf file or random:NAME spec; default the embedded SmolLM2."),
    requests: Optional[int] = typer.Option(None, min=1, help="Number of requests; default the workload's."),
    seed: int = typer.Option(0, help="Seed for the random prompts and lengths."),
    hf_requests: Optional[int] = typer.Option(
        None, "--hf-requests", help="Run the transformers baselines on only the first N requests (their tokens/s "
                                    "is measured on those); default all."),
    skip_baselines: bool = typer.Option(False, "--skip-baselines", help="Run only the engine."),
    baselines: Optional[str] = typer.Option(
        None, help=f"Comma-separated subset of {','.join(BASELINES)}; default all of them on a CPU, "
                   f"{','.join(CUDA_BASELINES)} on CUDA."),
    device: Optional[str] = typer.Option(None, help="cpu or cuda; default cuda when available."),
    threads: Optional[int] = typer.Option(
        None, min=1, help="torch threads for the whole run; default torch's (one per core). On a busy machine "
                          "1 gives steadier figures."),
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel ranks for the engine."),
    kv_dtype: str = typer.Option("auto", "--kv-dtype", help="The engine's KV cache: auto (the model's dtype) or fp8."),
    baseline_seconds: Optional[float] = typer.Option(
        None, "--baseline-seconds", min=1.0, help="Stop each baseline after this long and measure it on the "
                                                   "tokens it made; default 45 on CUDA, no limit on a CPU."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
) -> None:
    """Measure throughput against transformers (one at a time, static batch, continuous batching)."""
    err = Console(stderr=True)
    options = BenchOptions(workload=workload, model=model, requests=requests, seed=seed,
                           skip_baselines=skip_baselines, device=device, threads=threads, tp=tp,
                           hf_requests=hf_requests, baselines=baselines, kv_dtype=kv_dtype,
                           baseline_seconds=baseline_seconds)
    from render.bench import BenchProgress, bench_view

    with BenchProgress(err) as progress:  # a MinisglError becomes one line and exit 2 at the app's boundary
        report = run_bench(options, progress=progress, warn=lambda message: err.print(message, markup=False),
                           log=lambda message: err.print(message, markup=False, style="dim"))
    if as_json:
        typer.echo(json.dumps(report.to_dict()))
    else:
        Console().print(bench_view(report))
