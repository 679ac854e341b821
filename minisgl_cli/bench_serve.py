"""``minisgl bench --serve``: the engine behind ``minisgl serve``, driven at each rate, beside its offline figure.

The order: everything typed is checked first (a bad rate fails before torch loads); then the offline pass
(``LLM.generate`` on the requests, in this process) and its engine freed; then the server (one started here as
a child process on a free port, or the one at ``--url``), warmed up, and the same requests sent at each rate in
turn. Ctrl-C keeps what was measured: the rates done so far are printed, and the exit code is 130. A server
started here is stopped on every way out (minisgl_cli/server_process.py).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import typer
from rich.console import Console

from core.bench.serve_report import ServeReport, rate_name
from core.errors import InvalidParamsError
from minisgl_cli.engine_options import flag
from minisgl_cli.console import stderr_console
from minisgl_cli.exits import INTERRUPTED, SOME_FAILED
from minisgl_cli.jobs import quiet_transformers
from render.activity import Activity


@dataclass(frozen=True)
class ServeBench:
    """What was typed for one serving benchmark."""

    rates: tuple[float, ...]
    url: str | None
    api_key: str | None
    skip_offline: bool
    workload: str | None
    model: str | None
    requests: int | None
    seed: int
    threads: int | None
    device: str | None
    tp: int
    kv_dtype: str | None
    precision: str
    page_size: int | None
    max_running: int | None
    admission: str = "estimate"


def check_url(url: str | None, api_key: str | None = None) -> str | None:
    """A server's address as the client uses it: http(s)://host:port, without a trailing / or /v1 (the
    OpenAI clients' base URL is accepted too). A key goes only to a server given by --url (one started here
    wants none)."""
    if url is None:
        if api_key is not None:
            raise InvalidParamsError("--api-key is the key of the server at --url; add --url")
        return None
    if not url.startswith(("http://", "https://")):
        raise InvalidParamsError(f"--url must start with http:// or https://, got {url!r}")
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def check_combination(serve: bool, serve_only: dict[str, Any], bench_only: dict[str, Any]) -> None:
    """An option of the other mode is refused, not ignored: ``--rate`` without ``--serve`` would measure nothing
    of what it says."""
    if not serve:
        given = next((name for name, value in serve_only.items() if value not in (None, False)), None)
        if given:
            raise InvalidParamsError(f"{given} is an option of --serve; add --serve to measure a server")
    else:
        given = next((name for name, value in bench_only.items() if value not in (None, False)), None)
        if given:
            raise InvalidParamsError(f"{given} has no meaning with --serve, which runs no transformers baseline")


def run(options: ServeBench, as_json: bool) -> None:
    activity = Activity(stderr_console())
    with activity.phase("loading torch and the engine"):
        from core.bench.engine_run import WARM_UP_TOKENS
        from core.bench.serve_bench import engine_settings, run_offline, serve_workload
        from core.bench.workload import BenchRequest, redraw_ids
        from core.models.weights import DEFAULT_MODEL_NAME
        from minisgl_cli.serve_client import run_rate, served_model
        from render.bench import BenchProgress

        quiet_transformers()
    # a server at --url that cannot be reached, or wants a key, fails before the offline pass
    url_model = served_model(options.url, options.api_key) if options.url is not None else None
    workload, vocab = serve_workload(options.workload, options.model, options.requests, options.seed, activity.note)
    settings = engine_settings(workload, device=options.device, tp=options.tp, kv_dtype=options.kv_dtype,
                               precision=options.precision, page_size=options.page_size,
                               max_running=options.max_running, threads=options.threads,
                               admission=options.admission)
    report = ServeReport(workload.spec.name, options.model or DEFAULT_MODEL_NAME, options.url or "",
                         len(workload.requests), workload.prompt_tokens, workload.output_tokens)
    stages = {rate: f"rate {rate_name(rate)}" for rate in options.rates}
    # the server's prompts are drawn anew each run (their lengths and max_tokens stay the seed's), so neither an
    # earlier rate nor an earlier run against the same --url server finds them in its prefix cache
    salt = secrets.randbits(32)
    try:
        with BenchProgress(activity, {"offline": "tokens", **{s: "requests" for s in stages.values()}}) as progress:
            if not options.skip_offline:
                report.offline = run_offline(options.model, settings, workload, progress, progress.note)
            with _server(options, settings, progress.note) as url:
                report.url = url
                model = url_model if url_model is not None else served_model(url, options.api_key)
                progress.note(f"warming up the server: {len(workload.requests)} other prompts, a few tokens each")
                warm = redraw_ids(workload, vocab, salt)
                warm = replace(warm, requests=[BenchRequest(r.prompt_ids, min(r.max_tokens, WARM_UP_TOKENS))
                                               for r in warm.requests])
                warmed = run_rate(url, model, warm, float("inf"), options.seed, api_key=options.api_key)
                if not warmed.completed:
                    raise InvalidParamsError(f"the server failed every warm-up request: {warmed.first_error}")
                for i, rate in enumerate(options.rates):
                    stage = stages[rate]
                    sent = redraw_ids(workload, vocab, salt + 1 + i)
                    report.rates.append(run_rate(url, model, sent, rate, options.seed,
                                                 lambda done, total, stage=stage: progress(stage, done, total),
                                                 options.api_key))
    except KeyboardInterrupt:
        report.interrupted = True
        activity.line("interrupted")
    if as_json:
        typer.echo(json.dumps(report.to_dict()))
    else:
        from render.bench_serve import serve_view

        Console().print(serve_view(report))
    if report.interrupted:
        raise typer.Exit(INTERRUPTED)
    if any(r.failed for r in report.rates):
        raise typer.Exit(SOME_FAILED)


@contextmanager
def _server(options: ServeBench, settings: dict[str, Any], note: Callable[[str], None]) -> Iterator[str]:
    """The server's URL: ``--url``'s, or that of ``minisgl serve`` started here and stopped on leaving."""
    if options.url is not None:
        yield options.url
        return
    from minisgl_cli.server_process import ServerProcess, free_port, serve_arguments

    port = free_port()
    with ServerProcess(serve_arguments(options.model, settings, port, flag), port) as server:
        note(f"starting minisgl serve on port {port} and waiting for /health")
        server.wait_ready()
        yield server.url
