"""``minisgl serve``: the engine behind an OpenAI-compatible HTTP server.

Two processes: the engine (serving/engine_process.py: the scheduler's loop and nothing else, with its
tensor-parallel ranks under it) and this one, the API process: uvicorn's asyncio loop on the main thread does
HTTP, tokenizing, incremental text, stop strings and SSE; a receiver thread takes the engine's one message a
step (serving/remote.py); with ``--trace``, Rich's live display. They talk over ZMQ on local sockets. With
``--api-workers N``, N - 1 more API processes over the same engine (workers.py).

SIGTERM or Ctrl-C stops accepting connections and says on stderr how many responses it is finishing; they run
to their end for up to ``--shutdown-timeout`` seconds, then the rest are aborted (each stream still ends with a
last chunk and ``data: [DONE]``); the engine stops once every request is answered, and the server exits 0. A
second Ctrl-C stops at once (exit 130). If the engine process dies, every open stream ends with an error event,
new requests get a 503, /health fails, and the server exits 1 with one line naming the engine.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from minisgl_cli.engine_options import EngineOptions, with_engine_options
from core.errors import InvalidParamsError
from core.llm.heap import freeze_startup_heap
from core.words import ENGINE_READY, plural
from minisgl_cli.jobs import interrupted_load, quiet_transformers
from minisgl_cli.serve.listen import bind_listener
from render.activity import Activity

NETWORK = "Network"  # where it listens and whom it answers
WATCHING = "Watching it work"  # what it shows and writes of its work

Host = Annotated[str, typer.Option("--host", rich_help_panel=NETWORK, help="Address to listen on.")]
Port = Annotated[int, typer.Option("--port", rich_help_panel=NETWORK, min=0, max=65535, help="Port to listen on.")]
MaxQueue = Annotated[Optional[int], typer.Option(
    "--max-queue", min=1, help="Most requests waiting for their first token; beyond it, 503 with Retry-After.")]
ModelName = Annotated[Optional[str], typer.Option(
    "--served-model-name", help="The model's name in the API (default: the model's directory or file name).")]
DataParallel = Annotated[int, typer.Option(
    "--dp", min=1, help="Engine processes behind this one server, each a whole model (on CUDA, one GPU each); a "
                        "request goes to the engine most likely to hold its prompt's prefix, else the least loaded.")]
ApiKey = Annotated[Optional[str], typer.Option(
    "--api-key", rich_help_panel=NETWORK,
    help="Answer the API (/v1/, /tokenize, /detokenize) only with 'Authorization: Bearer KEY' (the openai client's "
         "api_key), else 401; /health, /metrics, /engines and /dashboard stay open.")]
SslCertFile = Annotated[Optional[Path], typer.Option(
    "--ssl-certfile", rich_help_panel=NETWORK, metavar="CERT.pem",
    help="Serve HTTPS with this certificate (chain), PEM; needs --ssl-keyfile.")]
SslKeyFile = Annotated[Optional[Path], typer.Option(
    "--ssl-keyfile", rich_help_panel=NETWORK, metavar="KEY.pem",
    help="The private key of --ssl-certfile, PEM (unencrypted).")]
AllowOrigin = Annotated[Optional[list[str]], typer.Option(
    "--allow-origin", rich_help_panel=NETWORK, metavar="ORIGIN",
    help="Let web pages from this origin (scheme://host[:port], or * for any) call the API from a browser (CORS); "
         "give it once per origin.")]
LogStats = Annotated[float, typer.Option(
    "--log-stats", rich_help_panel=WATCHING, min=0.0, metavar="SECONDS",
    help="While requests run, a line on stderr this often with the throughput, batch and KV cache; 0: never.")]
LogRequests = Annotated[bool, typer.Option(
    "--log-requests", rich_help_panel=WATCHING,
    help="Write a line on stderr as each API request ends: its id (X-Request-Id), client, path, status, engine uid, "
         "token counts, finish reason, time to first token and in all; never its text.")]
ShutdownTimeout = Annotated[float, typer.Option(
    "--shutdown-timeout", min=0.0, help="On SIGTERM/Ctrl-C, seconds to let responses in progress finish.")]
Trace = Annotated[bool, typer.Option(
    "--trace", rich_help_panel=WATCHING, help="Show the live batch table as requests arrive.")]
TraceOut = Annotated[Optional[Path], typer.Option(
    "--trace-out", rich_help_panel=WATCHING, metavar="FILE.jsonl", help="Write every step event as a JSON line.")]
Dashboard = Annotated[bool, typer.Option(
    "--dashboard", rich_help_panel=WATCHING,
    help="Serve a live view of the engine at /dashboard (batches, queue, KV pool, timeline).")]
LIMITS = "Limits (for a server open to strangers)"
MaxBodyBytes = Annotated[int, typer.Option(
    "--max-body-bytes", rich_help_panel=LIMITS, min=1, metavar="BYTES",
    help="Largest request body; beyond it, 413, answered before the rest is read.")]
ReadTimeout = Annotated[float, typer.Option(
    "--read-timeout", rich_help_panel=LIMITS, min=0.1, metavar="SECONDS",
    help="Time a client has to send its whole request (headers and body); beyond it, 408 and the connection "
         "closed.")]
MaxConnections = Annotated[int, typer.Option(
    "--max-connections", rich_help_panel=LIMITS, min=1,
    help="Most connections open at once (streams, idle keep-alive ones, the dashboard's); a request on one "
         "beyond it, 503 at once.")]
ApiWorkers = Annotated[Optional[int], typer.Option(
    "--api-workers", min=1, metavar="N",
    help="HTTP processes over the one engine, each streaming the requests it takes: more than one when the engine "
         "makes tokens faster than one process sends them (chunks of several tokens, a growing ITL); each counts "
         "its own --max-connections. Default: 2 on a GPU; 1 on a CPU, with --dp or with --dashboard.")]
DashboardShowText = Annotated[bool, typer.Option(
    "--dashboard-show-text", rich_help_panel=WATCHING,
    help="Show prompts and completions on the dashboard (else uids and token counts).")]


@with_engine_options
def serve(host: Host = "127.0.0.1", port: Port = 8000, max_queue: MaxQueue = None,
          served_model_name: ModelName = None, shutdown_timeout: ShutdownTimeout = 30.0, trace: Trace = False,
          trace_out: TraceOut = None, dashboard: Dashboard = False, dashboard_show_text: DashboardShowText = False,
          dp: DataParallel = 1, api_key: ApiKey = None, allow_origin: AllowOrigin = None,
          log_requests: LogRequests = False, log_stats: LogStats = 10.0, ssl_certfile: SslCertFile = None,
          ssl_keyfile: SslKeyFile = None, max_body_bytes: MaxBodyBytes = 8 * 1024 * 1024,
          read_timeout: ReadTimeout = 30.0, max_connections: MaxConnections = 1024, api_workers: ApiWorkers = None,
          engine: EngineOptions = EngineOptions.defaults()) -> None:
    """Serve the model over the OpenAI API: /v1/completions, /v1/chat/completions, /v1/models, /health,
    /metrics, and with --dashboard a live view of the engine at /dashboard."""
    from serving.api.bridge import EngineBridge
    from serving.api.limits import Limits
    from minisgl_cli.serve.checks import check_api_key, check_origins, check_tls
    from minisgl_cli.serve.http import Site, http_server, plain_lines
    from serving.api.stats_log import StatsLog
    from minisgl_cli.trace_exports import serve_header
    from minisgl_cli.trace_file import TraceFile

    err = Console(stderr=True, soft_wrap=True)  # a server's stderr is a log: a line is never cut in two
    activity = Activity(err)
    engine.check()
    check_api_key(api_key)
    check_origins(allow_origin or [])
    check_tls(ssl_certfile, ssl_keyfile)
    api_workers = api_workers_for(api_workers, engine.values["device"], dp, dashboard)
    listener = bind_listener(host, port, shared=api_workers > 1)  # a port in use fails now, before the load
    # a bad path fails before the load; the prompts are the clients', unknown yet (an open-ended trace)
    trace_file = TraceFile(trace_out, serve_header(engine)) if trace_out is not None else None
    if dashboard_show_text and not dashboard:
        raise typer.BadParameter("--dashboard-show-text needs --dashboard", param_hint="'--dashboard-show-text'")
    if dp > 1 and engine.values["tp"] > 1:
        raise InvalidParamsError("--dp with --tp is not supported: give one of them")
    remote = start_engine(engine, activity, trace=trace or trace_out is not None or dashboard, dp=dp,
                          clients=api_workers)
    if trace_file is not None:
        trace_file.decode = remote.tokenizer.decode
    name = served_model_name or default_model_name(engine.model)
    site = Site(api_key, tuple(origin.lower() for origin in allow_origin or ()), log_requests,
                Limits(max_body_bytes, read_timeout, max_connections), ssl_certfile, ssl_keyfile, shutdown_timeout)
    share, workers = start_api_workers(remote, api_workers, name, max_queue, site, activity, listener)
    bridge = EngineBridge(remote, name, max_queue, keep_text=dashboard_show_text, share=share)
    live = start_trace(remote, engine.cache, err) if trace else None
    if trace_file is not None:
        remote.add_step_callback(trace_file.write)
    server = http_server(bridge, site, err)
    if dashboard:
        ring = add_dashboard(server.app, bridge, serve_header(engine).options, dashboard_show_text)
        server.on_exit.append(ring.close)  # an open page's endless stream must not hold the drain up
    if workers is not None:
        server.on_signal.append(workers.signal)
        say = plain_lines(err)
        workers.watch(lambda line: None if remote.dead is not None else say(line))  # the engine's death is said
        share.start(bridge.counts)
    stats = StatsLog(bridge, plain_lines(err), log_stats) if log_stats > 0 else None
    freeze_startup_heap()  # built: the collector walks only what serving allocates from here on
    server.take_signals()
    scheme = "https" if ssl_certfile is not None else "http"
    processes = f" in {api_workers} API processes" if api_workers > 1 else ""
    err.print(f"minisgl serving [bold]{name}[/] on {scheme}://{host}:{port}/v1{processes} (Ctrl-C to stop); "
              f"{escape(remote.sampling_defaults.describe())}", highlight=False)
    if dashboard:
        err.print(f"dashboard: {scheme}://{host}:{port}/dashboard", highlight=False)
    if stats is not None:
        stats.start()
    try:
        server.run(sockets=[listener])
    finally:
        if workers is not None:  # their streams end before the engine stops
            workers.join(shutdown_timeout)
            share.stop(remove=True)
        if stats is not None:
            stats.stop()
        remote.stop()  # every request still in the engine is answered before it exits
        if live is not None:
            live.stop()
        if trace_file is not None:
            trace_file.close()
        server.release_signals()
    say_how_it_stopped(server, bridge, err)


def check_api_workers(api_workers: int | None, dp: int, dashboard: bool) -> None:
    if api_workers is not None and api_workers > 1 and dp > 1:
        raise InvalidParamsError("--api-workers with --dp is not supported: give one of them")
    if api_workers is not None and api_workers > 1 and dashboard:
        raise InvalidParamsError("--dashboard needs one API process (it shows the requests of the process that "
                                 "took them): leave out --api-workers")


def api_workers_for(given: int | None, device: str | None, dp: int, dashboard: bool) -> int:
    """``--api-workers`` (checked), or by default 2 where the engine runs on CUDA (one API process falls behind a
    busy GPU's engine, docs/BENCHMARKS.md) and 1 on a CPU (where the engine wants the cores), with --dp or with
    --dashboard."""
    check_api_workers(given, dp, dashboard)
    if given is not None:
        return given
    if dp > 1 or dashboard:
        return 1
    import torch

    on_cuda = device.startswith("cuda") if device is not None else torch.cuda.is_available()
    return 2 if on_cuda else 1


def start_api_workers(remote: Any, api_workers: int, name: str, max_queue: int | None, site: Any,
                      activity: Activity, listener: socket.socket) -> tuple[Any, Any]:
    """With ``--api-workers N``, the N - 1 other API processes, started once the engine is built; and this
    process's place among them (its counts shared with theirs)."""
    if api_workers == 1:
        return None, None
    from minisgl_cli.serve.workers import ApiWorkers, WorkerPlan
    from serving.api.share import SharedCounts

    share_dir = Path(tempfile.mkdtemp(prefix="minisgl-api-"))
    address = listener.getsockname()[:2]  # the port the first process bound (also for --port 0)
    plans = [WorkerPlan(remote.link(i), remote.config, remote.model_dir, name, max_queue, site, share_dir, os.getpid(),
                        address) for i in range(1, api_workers)]
    workers = ApiWorkers()
    with interrupted_load(activity), activity.phase(f"starting {plural(api_workers - 1, 'more API process')}"):
        try:
            workers.start(plans)
        except BaseException:
            remote.close()
            shutil.rmtree(share_dir, ignore_errors=True)
            raise
    return SharedCounts(share_dir, 0, api_workers), workers


def say_how_it_stopped(server: Any, bridge: Any, err: Console) -> None:
    """The last line: how many requests were answered, or why the server stopped (exit 1)."""
    if server.engine_death is not None:
        err.print(f"minisgl: {server.engine_death}", highlight=False, markup=False)
        raise typer.Exit(1)
    if not server.started:
        raise typer.Exit(1)
    answered = sum(bridge.totals().requests.values())
    err.print(f"minisgl stopped: {plural(answered, 'request')} answered", highlight=False)


def add_dashboard(app: Any, bridge: Any, options: dict[str, Any], show_text: bool) -> Any:
    """/dashboard and its event stream, fed by the engine's step events."""
    from minisgl_cli.dashboard import add_live_dashboard
    from serving.api.figures import LiveFigures

    remote = bridge.llm
    ring = add_live_dashboard(app, bridge.facts, show_text, bridge.model_name, options,
                              decode=remote.tokenizer.decode, report_radix=remote.report_radix,
                              figures=LiveFigures(bridge))
    remote.add_step_callback(ring.add)
    return ring


def start_engine(engine: EngineOptions, activity: Activity, trace: bool, dp: int = 1, clients: int = 1) -> Any:
    """The tokenizer here, the engine in its own process (or ``dp`` of them), loading at the same time; the load
    is shown as every command shows one. ``clients``: the API processes that will talk to the engine."""
    name = engine.model or "the embedded SmolLM2-135M-Instruct"
    with interrupted_load(activity), activity.phase(f"loading {name}", closing=ENGINE_READY):
        from core.config import EngineConfig
        from core.models.tokenizer import load_tokenizer
        from serving.remote import RemoteEngine
        from core.models.weights import resolve_model_dir

        quiet_transformers()
        model_dir = resolve_model_dir(engine.model, activity.note)
        config = EngineConfig.from_options(**engine.values)
        if dp == 1:
            remote = RemoteEngine(config, model_dir, trace=trace, uid_step=clients, clients=clients)
        else:
            from serving.data_parallel import DataParallelEngines

            threads = max(1, (os.cpu_count() or 1) // dp)  # on a CPU the engines share its cores
            remote = DataParallelEngines([RemoteEngine(config, model_dir, trace=trace, first_uid=i, uid_step=dp,
                                                       threads=threads, gpu=i) for i in range(dp)])
        try:  # the tokenizer loads here while the engine process loads the model
            remote.start(log=activity.note, while_loading=lambda: remote.give_tokenizer(load_tokenizer(model_dir)))
        except BaseException:
            remote.close()
            raise
    return remote


def default_model_name(model: str | None) -> str:
    if model is None:
        return "SmolLM2-135M-Instruct"
    if model.startswith("random:"):
        return model
    return Path(model.rstrip("/")).name


def start_trace(llm, cache: str, err: Console):
    """The live step table of ``minisgl trace``, fed by the engine's step events as real requests arrive."""
    from rich.live import Live

    from render.steps import LiveSteps

    steps = LiveSteps(show_cached=cache == "radix")
    live = Live(steps, console=err, refresh_per_second=8, transient=False)
    live.start()

    def on_step(event) -> None:
        steps.total_requests = max(steps.total_requests, steps.finished + len(event.finished) + llm.unanswered)
        steps.add(event)

    llm.add_step_callback(on_step)
    return live
