"""``minisgl bench``: the engine and transformers side by side on the same requests; with ``--serve``, the engine
behind its HTTP server at several request rates (minisgl_cli/bench_serve.py)."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from core.bench.names import BASELINES, CUDA_BASELINES, parse_baselines
from core.bench.workload import WORKLOADS, workload_spec
from core.models.weights import check_model_path
from minisgl_cli.console import stderr_console, stdout_console
from minisgl_cli.exits import INTERRUPTED
from minisgl_cli.jobs import interrupted_load, quiet_transformers
from minisgl_cli.engine_options import engine_option
from minisgl_cli.options import FLAG
from render.activity import Activity

SERVING = "Serving (--serve)"


def _check_rates(value: Optional[str]) -> Optional[str]:
    """A bad --rate is a usage error before anything loads."""
    from core.errors import InvalidParamsError
    from minisgl_cli.serve_client import parse_rates

    if value is not None:
        try:
            parse_rates(value)
        except InvalidParamsError as exc:
            raise typer.BadParameter(str(exc)) from None
    return value


Workload = Annotated[Optional[str], typer.Option(
    help=f"One of {', '.join(WORKLOADS)}; default 'cpu' without CUDA, else 'nanovllm'.")]
Requests = Annotated[Optional[int], typer.Option(min=1, help="Number of requests; default the workload's.")]
Seed = Annotated[int, typer.Option(help="Seed for the random prompts and lengths.")]
HfRequests = Annotated[Optional[int], typer.Option(
    "--hf-requests", min=1, help="Run the transformers baselines on only the first N requests (their tokens/s is "
                                 "measured on those); default all.")]
SkipBaselines = Annotated[bool, typer.Option("--skip-baselines", metavar=FLAG, help="Run only the engine.")]
Baselines = Annotated[Optional[str], typer.Option(
    help=f"A comma-separated subset of {', '.join(BASELINES)} (written without spaces, e.g. "
         f"{BASELINES[0]},{BASELINES[1]}); default all of them on a CPU, {' and '.join(CUDA_BASELINES)} on CUDA.")]
PageSize = Annotated[Optional[int], typer.Option(
    "--page-size", min=1, help="Tokens per KV page for the engine; default 128 on CUDA (flashinfer's decode reads "
                               "large head-major pages fastest), the engine's default (1) on a CPU.")]
BaselineSeconds = Annotated[Optional[float], typer.Option(
    "--baseline-seconds", min=1.0, help="Stop each baseline after this long and measure it on the tokens it made; "
                                        "default 45 on CUDA, no limit on a CPU.")]
AsJson = Annotated[bool, typer.Option("--json", metavar=FLAG, help="Print one JSON object instead of the table.")]
Serve = Annotated[bool, typer.Option(
    "--serve", metavar=FLAG, rich_help_panel=SERVING,
    help="Measure the engine behind 'minisgl serve' instead: the requests as streaming completions at each --rate "
         "(throughput, TTFT, TPOT, ITL), beside LLM.generate on the same requests.")]
Rate = Annotated[Optional[str], typer.Option(
    "--rate", callback=_check_rates, rich_help_panel=SERVING, show_default=False,
    help="Requests per second, Poisson arrivals (seeded); a comma-separated list runs each in turn; 'inf' sends "
         "every request at once. Default: inf.")]
Url = Annotated[Optional[str], typer.Option(
    "--url", rich_help_panel=SERVING,
    help="Drive the server already running at this address (e.g. http://127.0.0.1:8000) instead of starting one; "
         "--model then names its model (its config gives the vocabulary the prompts are drawn from).")]
ApiKey = Annotated[Optional[str], typer.Option(
    "--api-key", rich_help_panel=SERVING,
    help="The key the server at --url wants (its 'minisgl serve --api-key'), sent as a bearer token.")]
SkipOffline = Annotated[bool, typer.Option(
    "--skip-offline", metavar=FLAG, rich_help_panel=SERVING,
    help="Leave out the offline pass (LLM.generate in this process).")]
MaxRunning = Annotated[Optional[int], typer.Option(
    "--max-running", min=1, rich_help_panel=SERVING,
    help="Most requests in one batch, for the server started here and the offline engine alike; default every "
         "request, at most 256.")]


def bench(workload: Workload = None, model: engine_option("model") = None, requests: Requests = None, seed: Seed = 0,
          hf_requests: HfRequests = None, skip_baselines: SkipBaselines = False, baselines: Baselines = None,
          device: engine_option("device") = None, threads: engine_option("threads") = None, tp: engine_option("tp") = 1,
          kv_dtype: engine_option("kv_dtype") = "auto", precision: engine_option("precision") = "exact",
          page_size: PageSize = None, baseline_seconds: BaselineSeconds = None, as_json: AsJson = False,
          serve: Serve = False, rate: Rate = None, url: Url = None, api_key: ApiKey = None,
          skip_offline: SkipOffline = False, max_running: MaxRunning = None,
          admission: engine_option("admission") = "estimate") -> None:
    """Measure throughput against transformers (one at a time, static batch, continuous batching).

    With --precision fast (or int8) the exact engine runs first in the same run, as 'minisgl exact'.

    Every phase (loading, warm-up, each engine and baseline) is reported on stderr as it starts; stdout gets
    only the table (or the JSON).

    With --serve: 'minisgl serve' started on a free port (or the server at --url), warmed up, then driven at each
    --rate; Ctrl-C prints the rates measured so far.

    Ctrl-C prints what was measured before it (the runs that finished) and exits with code 130."""
    from minisgl_cli import bench_serve

    bench_serve.check_combination(
        serve, {"--rate": rate, "--url": url, "--api-key": api_key, "--skip-offline": skip_offline,
                "--max-running": max_running},
        {"--hf-requests": hf_requests, "--skip-baselines": skip_baselines, "--baselines": baselines,
         "--baseline-seconds": baseline_seconds})
    if workload is not None:  # what can be checked without torch is checked before it loads
        workload_spec(workload)
    check_model_path(model)
    if serve:
        from minisgl_cli.serve_client import parse_rates

        bench_serve.run(bench_serve.ServeBench(
            rates=parse_rates(rate or "inf"), url=bench_serve.check_url(url, api_key), api_key=api_key,
            skip_offline=skip_offline, workload=workload, model=model, requests=requests, seed=seed, threads=threads,
            device=device, tp=tp, kv_dtype=kv_dtype, precision=precision, page_size=page_size,
            max_running=max_running, admission=admission), as_json)
        return
    parse_baselines(baselines)
    activity = Activity(stderr_console())
    with interrupted_load(activity), activity.phase("loading torch and the engine"):
        from core.bench import BenchOptions, run_bench

        quiet_transformers()
    options = BenchOptions(workload=workload, model=model, requests=requests, seed=seed,
                           skip_baselines=skip_baselines, device=device, threads=threads, tp=tp,
                           hf_requests=hf_requests, baselines=baselines, kv_dtype=kv_dtype,
                           baseline_seconds=baseline_seconds, precision=precision, page_size=page_size,
                           admission=admission)
    from render.bench import BenchProgress, bench_view, interrupted_view

    measured: list = []  # each run's figures as soon as it has them: Ctrl-C prints those
    try:
        with BenchProgress(activity) as progress:  # a MinisglError becomes one line and exit 2 at the app's boundary
            report = run_bench(options, progress=progress, warn=activity.line, log=progress.note,
                               measured=measured.append)
    except KeyboardInterrupt:
        activity.line("interrupted; the runs measured so far follow (exit code 130)")
        if as_json:
            typer.echo(json.dumps({"interrupted": True, "results": [r.to_dict() for r in measured]}))
        else:
            stdout_console().print(interrupted_view(measured))
        raise typer.Exit(INTERRUPTED) from None
    if as_json:
        typer.echo(json.dumps(report.to_dict()))
    else:
        stdout_console().print(bench_view(report))
