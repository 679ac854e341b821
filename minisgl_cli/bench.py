"""``minisgl bench``: the engine and transformers side by side on the same requests."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console

from core.bench.names import BASELINES, CUDA_BASELINES, parse_baselines
from core.bench.workload import WORKLOADS, workload_spec
from minisgl_cli.console import stdout_console
from minisgl_cli.jobs import quiet_transformers
from minisgl_cli import options as o
from minisgl_cli.options import FLAG
from render.activity import Activity


def bench(
    workload: Optional[str] = typer.Option(
        None, help=f"One of {', '.join(WORKLOADS)}; default 'cpu' without CUDA, else 'nanovllm'."),
    model: Optional[str] = typer.Option(
        None, help="Model directory, .gguf file or random:NAME spec; default the embedded SmolLM2."),
    requests: Optional[int] = typer.Option(None, min=1, help="Number of requests; default the workload's."),
    seed: int = typer.Option(0, help="Seed for the random prompts and lengths."),
    hf_requests: Optional[int] = typer.Option(
        None, "--hf-requests", min=1, help="Run the transformers baselines on only the first N requests (their tokens/s "
                                    "is measured on those); default all."),
    skip_baselines: bool = typer.Option(False, "--skip-baselines", metavar=FLAG, help="Run only the engine."),
    baselines: Optional[str] = typer.Option(
        None, help=f"A comma-separated subset of {', '.join(BASELINES)} (written without spaces, e.g. "
                   f"{BASELINES[0]},{BASELINES[1]}); default all of them on a CPU, {' and '.join(CUDA_BASELINES)} "
                   f"on CUDA."),
    device: Optional[str] = typer.Option(None, help="cpu or cuda; default cuda when available."),
    threads: Optional[int] = typer.Option(
        None, min=1, help="torch threads for the whole run; default torch's (one per core). On a busy machine "
                          "1 gives steadier figures."),
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel ranks for the engine."),
    kv_dtype: str = typer.Option("auto", "--kv-dtype", help="The engine's KV cache: auto (the model's dtype) or fp8."),
    precision: o.Precision = "exact",
    page_size: Optional[int] = typer.Option(
        None, "--page-size", min=1, help="Tokens per KV page for the engine; default 128 on CUDA (flashinfer's decode "
                                         "reads large head-major pages fastest), the engine's default (1) on a CPU."),
    baseline_seconds: Optional[float] = typer.Option(
        None, "--baseline-seconds", min=1.0, help="Stop each baseline after this long and measure it on the "
                                                   "tokens it made; default 45 on CUDA, no limit on a CPU."),
    as_json: bool = typer.Option(False, "--json", metavar=FLAG, help="Print one JSON object instead of the table."),
) -> None:
    """Measure throughput against transformers (one at a time, static batch, continuous batching).

    With --precision fast (or int8) the exact engine runs first in the same run, as 'minisgl exact'.

    Every phase (loading, warm-up, each engine and baseline) is reported on stderr as it starts; stdout gets
    only the table (or the JSON)."""
    if workload is not None:  # what can be checked without torch is checked before it loads
        workload_spec(workload)
    parse_baselines(baselines)
    activity = Activity(Console(stderr=True))
    with activity.phase("loading torch and the engine"):
        from core.bench import BenchOptions, run_bench

        quiet_transformers()
    options = BenchOptions(workload=workload, model=model, requests=requests, seed=seed,
                           skip_baselines=skip_baselines, device=device, threads=threads, tp=tp,
                           hf_requests=hf_requests, baselines=baselines, kv_dtype=kv_dtype,
                           baseline_seconds=baseline_seconds, precision=precision, page_size=page_size)
    from render.bench import BenchProgress, bench_view

    with BenchProgress(activity) as progress:  # a MinisglError becomes one line and exit 2 at the app's boundary
        report = run_bench(options, progress=progress, warn=activity.line, log=progress.note)
    if as_json:
        typer.echo(json.dumps(report.to_dict()))
    else:
        stdout_console().print(bench_view(report))
