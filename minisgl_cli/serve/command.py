"""``minisgl serve``: the engine behind an OpenAI-compatible HTTP server.

Three threads of work: the engine's loop (``LLM.serve_forever`` on a thread of its own), the HTTP side
(uvicorn's asyncio loop on the main thread) and, with ``--trace``, Rich's live display. SIGTERM or Ctrl-C
stops accepting connections, lets every response in progress finish (for up to ``--shutdown-timeout``
seconds; then the rest are aborted, their clients told so), stops the engine once every request is
answered, and exits 0.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from minisgl_cli import options as o
from minisgl_cli.engine_options import EngineOptions, with_engine_options
from minisgl_cli.jobs import load_llm
from render.activity import Activity

Host = Annotated[str, typer.Option("--host", help="Address to listen on.")]
Port = Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on.")]
MaxQueue = Annotated[Optional[int], typer.Option(
    "--max-queue", min=1, help="Most requests waiting for their first token; beyond it, 503 with Retry-After.")]
ModelName = Annotated[Optional[str], typer.Option(
    "--served-model-name", help="The model's name in the API (default: the model's directory or file name).")]
ShutdownTimeout = Annotated[float, typer.Option(
    "--shutdown-timeout", min=0.0, help="On SIGTERM/Ctrl-C, seconds to let responses in progress finish.")]
Trace = Annotated[bool, typer.Option("--trace", help="Show the live batch table as requests arrive.")]
TraceOut = Annotated[Optional[Path], typer.Option(
    "--trace-out", metavar="FILE.jsonl", help="Write every step event as a JSON line.")]


@with_engine_options
def serve(host: Host = "127.0.0.1", port: Port = 8000, max_queue: MaxQueue = None,
          served_model_name: ModelName = None, shutdown_timeout: ShutdownTimeout = 30.0, trace: Trace = False,
          trace_out: TraceOut = None, engine: EngineOptions = EngineOptions.defaults()) -> None:
    """Serve the model over the OpenAI API: /v1/completions, /v1/chat/completions, /v1/models, /health,
    /metrics."""
    import uvicorn  # the server's libraries load only for this command

    from minisgl_cli.serve.api import create_app
    from minisgl_cli.serve.bridge import EngineBridge
    from minisgl_cli.trace_exports import serve_header
    from minisgl_cli.trace_file import TraceFile

    err = Console(stderr=True)
    # a bad path fails before the load; the prompts are the clients', unknown yet (an open-ended trace)
    trace_file = TraceFile(trace_out, serve_header(engine)) if trace_out is not None else None
    llm = load_llm(engine, Activity(err))
    if trace_file is not None:
        trace_file.decode = llm.tokenizer.decode
    name = served_model_name or default_model_name(engine.model)
    bridge = EngineBridge(llm, name, max_queue)
    live = start_trace(llm, err) if trace else None
    if trace_file is not None:
        llm.add_step_callback(trace_file.write)
    loop = threading.Thread(target=llm.serve_forever, name="minisgl-engine", daemon=True)
    loop.start()
    config = uvicorn.Config(create_app(bridge), host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=shutdown_timeout, access_log=False)
    server = uvicorn.Server(config)
    signals = _keep_signals()  # uvicorn re-raises the signal it stopped on: it must not kill us then
    err.print(f"minisgl serving [bold]{name}[/] on http://{host}:{port}/v1 (Ctrl-C to stop)", highlight=False)
    try:
        server.run()
    finally:
        llm.stop()  # every request still in the engine is answered before the loop returns
        loop.join()
        if live is not None:
            live.stop()
        if trace_file is not None:
            trace_file.close()
        llm.close()
        signals.restore()
    if not server.started:
        raise typer.Exit(1)
    err.print(f"minisgl stopped: {sum(bridge.metrics.requests.values())} requests answered", highlight=False)


def default_model_name(model: str | None) -> str:
    if model is None:
        return "SmolLM2-135M-Instruct"
    if model.startswith("random:"):
        return model
    return Path(model.rstrip("/")).name


class _keep_signals:
    """While serving: SIGINT and SIGTERM are only noted here (uvicorn installs its own during ``run``)."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self._old = {sig: signal.signal(sig, self._note) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _note(self, sig: int, _frame: object) -> None:
        self.received.append(sig)

    def restore(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def start_trace(llm, err: Console):
    """The live step table of ``minisgl trace``, fed by the engine's step events as real requests arrive."""
    from rich.live import Live

    from render.steps import LiveSteps

    steps = LiveSteps(show_cached=llm.config.cache == "radix")
    live = Live(steps, console=err, refresh_per_second=8, transient=False)
    live.start()

    def on_step(event) -> None:
        steps.total_requests = max(steps.total_requests, steps.finished + len(event.finished) + llm.unanswered)
        steps.add(event)

    llm.add_step_callback(on_step)
    return live
