"""``minisgl serve``: the engine behind an OpenAI-compatible HTTP server.

Two processes: the engine (serving/engine_process.py: the scheduler's loop and nothing else, with its
tensor-parallel ranks under it) and this one, the API process: uvicorn's asyncio loop on the main thread does
HTTP, tokenizing, incremental text, stop strings and SSE; a receiver thread takes the engine's one message a
step (serving/remote.py); with ``--trace``, Rich's live display. They talk over ZMQ on local sockets.

SIGTERM or Ctrl-C stops accepting connections and says on stderr how many responses it is finishing; they run
to their end for up to ``--shutdown-timeout`` seconds, then the rest are aborted (each stream still ends with a
last chunk and ``data: [DONE]``); the engine stops once every request is answered, and the server exits 0. A
second Ctrl-C stops at once (exit 130). If the engine process dies, every open stream ends with an error event,
new requests get a 503, /health fails, and the server exits 1 with one line naming the engine.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape

from minisgl_cli.engine_options import EngineOptions, with_engine_options
from core.errors import InvalidParamsError
from core.llm.heap import freeze_startup_heap
from core.words import ENGINE_READY, plural
from minisgl_cli.exits import INTERRUPTED
from minisgl_cli.jobs import interrupted_load, quiet_transformers
from render.activity import Activity

ENGINE_DEATH_GRACE_S = 2.0  # how long a server whose engine died answers 503 before it exits

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
          read_timeout: ReadTimeout = 30.0, max_connections: MaxConnections = 1024,
          engine: EngineOptions = EngineOptions.defaults()) -> None:
    """Serve the model over the OpenAI API: /v1/completions, /v1/chat/completions, /v1/models, /health,
    /metrics, and with --dashboard a live view of the engine at /dashboard."""
    import uvicorn  # the server's libraries load only for this command

    from serving.api.app import create_app
    from serving.api.bridge import EngineBridge
    from serving.api.connection import limited_protocol
    from serving.api.limits import Limits
    from minisgl_cli.serve.checks import check_api_key, check_origins, check_tls
    from serving.api.stats_log import StatsLog
    from minisgl_cli.trace_exports import serve_header
    from minisgl_cli.trace_file import TraceFile

    err = Console(stderr=True, soft_wrap=True)  # a server's stderr is a log: a line is never cut in two
    activity = Activity(err)
    engine.check()
    check_api_key(api_key)
    check_origins(allow_origin or [])
    check_tls(ssl_certfile, ssl_keyfile)
    listener = bind_listener(host, port)  # a port in use fails now, before the model loads
    # a bad path fails before the load; the prompts are the clients', unknown yet (an open-ended trace)
    trace_file = TraceFile(trace_out, serve_header(engine)) if trace_out is not None else None
    if dashboard_show_text and not dashboard:
        raise typer.BadParameter("--dashboard-show-text needs --dashboard", param_hint="'--dashboard-show-text'")
    if dp > 1 and engine.values["tp"] > 1:
        raise InvalidParamsError("--dp with --tp is not supported: give one of them")
    remote = start_engine(engine, activity, trace=trace or trace_out is not None or dashboard, dp=dp)
    if trace_file is not None:
        trace_file.decode = remote.tokenizer.decode
    name = served_model_name or default_model_name(engine.model)
    bridge = EngineBridge(remote, name, max_queue, keep_text=dashboard_show_text)
    live = start_trace(remote, engine.cache, err) if trace else None
    if trace_file is not None:
        remote.add_step_callback(trace_file.write)
    limits = Limits(max_body_bytes, read_timeout, max_connections)
    app = create_app(bridge, api_key, log_request=plain_lines(err) if log_requests else None,
                     allow_origins=[origin.lower() for origin in allow_origin or ()], limits=limits)
    ring = add_dashboard(app, bridge, serve_header(engine).options, dashboard_show_text) if dashboard else None
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=None, access_log=False,
                            ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile,
                            http=limited_protocol(limits, bridge.metrics.rejected_with))
    server = DrainingServer(config, bridge, shutdown_timeout, err)
    if ring is not None:
        server.on_exit.append(ring.close)  # an open page's endless stream must not hold the drain up
    remote.on_death = server.engine_died
    stats = StatsLog(bridge, plain_lines(err), log_stats) if log_stats > 0 else None
    freeze_startup_heap()  # built: the collector walks only what serving allocates from here on
    server.take_signals()
    scheme = "https" if ssl_certfile is not None else "http"
    err.print(f"minisgl serving [bold]{name}[/] on {scheme}://{host}:{port}/v1 (Ctrl-C to stop); "
              f"{escape(remote.sampling_defaults.describe())}", highlight=False)
    if dashboard:
        err.print(f"dashboard: {scheme}://{host}:{port}/dashboard", highlight=False)
    if stats is not None:
        stats.start()
    try:
        server.run(sockets=[listener])
    finally:
        if stats is not None:
            stats.stop()
        remote.stop()  # every request still in the engine is answered before it exits
        if live is not None:
            live.stop()
        if trace_file is not None:
            trace_file.close()
        server.release_signals()
    say_how_it_stopped(server, bridge, err)


def say_how_it_stopped(server: DrainingServer, bridge: Any, err: Console) -> None:
    """The last line: how many requests were answered, or why the server stopped (exit 1)."""
    if server.engine_death is not None:
        err.print(f"minisgl: {server.engine_death}", highlight=False, markup=False)
        raise typer.Exit(1)
    if not server.started:
        raise typer.Exit(1)
    err.print(f"minisgl stopped: {plural(sum(bridge.metrics.requests.values()), 'request')} answered", highlight=False)


def plain_lines(err: Console) -> Callable[[str], None]:
    """Lines written as they are (no markup or highlighting), above a live --trace table."""
    return lambda line: err.print(line, highlight=False, markup=False)


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


def bind_listener(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything slow: a port in use or a bad host is a usage error."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)  # connections made before the server runs wait in the backlog, not refused
    except OSError as exc:
        raise InvalidParamsError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def start_engine(engine: EngineOptions, activity: Activity, trace: bool, dp: int = 1) -> Any:
    """The tokenizer here, the engine in its own process (or ``dp`` of them), loading at the same time; the load
    is shown as every command shows one."""
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
            remote = RemoteEngine(config, model_dir, trace=trace)
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


class DrainingServer:
    """uvicorn's server with the shutdown a streaming API needs: finish what is open, for a while, then abort
    it so that every stream still ends properly; a second signal leaves at once."""

    def __init__(self, config: Any, bridge: Any, timeout_s: float, err: Console) -> None:
        import uvicorn

        outer = self

        class _Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                outer._on_signal(sig)

        self._server = _Server(config)
        self._bridge = bridge
        self._timeout_s = timeout_s
        self._err = err
        self._signals = 0
        self._old: dict[int, Any] = {}
        self.engine_death: str | None = None
        self.on_exit: list[Callable[[], None]] = []  # run as the server starts to leave: streams that never end

    @property
    def started(self) -> bool:
        return self._server.started

    def run(self, sockets: list[socket.socket]) -> None:
        self._server.run(sockets=sockets)

    def take_signals(self) -> None:
        """From now until ``release_signals``, also before and after uvicorn runs (it hands the signals to the
        same place while it does): SIGINT or SIGTERM starts the drain, a second one stops at once."""
        self._old = {sig: signal.signal(sig, lambda sig, _frame: self._on_signal(sig))
                     for sig in (signal.SIGINT, signal.SIGTERM)}

    def release_signals(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    def _on_signal(self, sig: int) -> None:
        self._signals += 1
        if self._signals > 1:  # the second Ctrl-C: no more waiting
            self._err.print("minisgl: stopped at once", highlight=False)
            self._bridge.llm.close()
            os._exit(INTERRUPTED)
        open_responses = self._bridge.in_flight
        self._err.print(f"minisgl: shutting down; finishing {plural(open_responses, 'response')} (up to "
                        f"{self._timeout_s:g} s; Ctrl-C again to stop at once)", highlight=False)
        self._leave()
        timer = threading.Timer(self._timeout_s, self._bridge.abort_all)
        timer.daemon = True
        timer.start()

    def _leave(self) -> None:
        self._server.should_exit = True
        for close in self.on_exit:
            close()

    def engine_died(self, why: str) -> None:
        """On the receiver's thread: open streams have their error event. For a moment the server goes on
        answering 503 (and /health fails), so clients and load balancers learn why; then it leaves."""
        self.engine_death = why
        timer = threading.Timer(ENGINE_DEATH_GRACE_S, self._leave)
        timer.daemon = True
        timer.start()


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
