"""How ``minisgl serve``'s HTTP side is built and stopped, the same in each of its API processes: the app over an
engine bridge, run by uvicorn with the limits' protocol, and the drain on SIGTERM or Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from core.words import plural
from minisgl_cli.exits import INTERRUPTED
from serving.api.limits import Limits

ENGINE_DEATH_GRACE_S = 2.0  # how long a server whose engine died answers 503 before it exits


@dataclass(frozen=True)
class Site:
    """The HTTP side's options, the same in every API process."""

    api_key: str | None
    allow_origins: tuple[str, ...]
    log_requests: bool
    limits: Limits
    ssl_certfile: Path | None
    ssl_keyfile: Path | None
    shutdown_timeout: float


def http_server(bridge: Any, site: Site, err: Console, announce: bool = True) -> DrainingServer:
    """The app over ``bridge`` and the server that runs it; a dead engine makes it answer 503 and leave."""
    import uvicorn

    from serving.api.app import create_app
    from serving.api.connection import limited_protocol

    app = create_app(bridge, site.api_key, log_request=plain_lines(err) if site.log_requests else None,
                     allow_origins=list(site.allow_origins), limits=site.limits)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=None, access_log=False,
                            ssl_certfile=site.ssl_certfile, ssl_keyfile=site.ssl_keyfile,
                            http=limited_protocol(site.limits, bridge.metrics.rejected_with))
    server = DrainingServer(config, bridge, site.shutdown_timeout, err, announce)
    bridge.llm.on_death = server.engine_died
    return server


def plain_lines(err: Console) -> Callable[[str], None]:
    """Lines written as they are (no markup or highlighting), above a live --trace table."""
    return lambda line: err.print(line, highlight=False, markup=False)


class DrainingServer:
    """uvicorn's server with the shutdown a streaming API needs: finish what is open, for a while, then abort
    it so that every stream still ends properly; a second signal leaves at once."""

    def __init__(self, config: Any, bridge: Any, timeout_s: float, err: Console, announce: bool = True) -> None:
        """``announce``: say on stderr that it drains or stops (the first API process speaks for the others)."""
        import uvicorn

        outer = self

        class _Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                outer._on_signal(sig)

        self._server = _Server(config)
        self._bridge = bridge
        self._timeout_s = timeout_s
        self._err = err
        self._announce = announce
        self._signals = 0
        self._old: dict[int, Any] = {}
        self.engine_death: str | None = None
        self.on_exit: list[Callable[[], None]] = []  # run as the server starts to leave: streams that never end
        self.on_signal: list[Callable[[], None]] = []  # run on every signal taken: the other API processes told

    @property
    def app(self) -> Any:
        return self._server.config.app

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
        for tell in self.on_signal:
            tell()
        if self._signals > 1:  # the second Ctrl-C: no more waiting
            if self._announce:
                self._err.print("minisgl: stopped at once", highlight=False)
            self._bridge.llm.close()
            os._exit(INTERRUPTED)
        if self._announce:
            self._err.print(f"minisgl: shutting down; finishing {plural(self._bridge.open_responses(), 'response')}"
                            f" (up to {self._timeout_s:g} s; Ctrl-C again to stop at once)", highlight=False)
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
