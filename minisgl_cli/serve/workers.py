"""``serve --api-workers N``: the HTTP side in N processes over one engine.

One API process streams every token of every request it took: it detokenizes, writes a chunk of JSON and sends
it. Python runs that on one core, so a fast engine can make tokens faster than one process sends them (the
chunks then carry several tokens each, late). With N, the first process (the one ``minisgl serve`` started:
the engine's owner, the trace, the signals) starts N - 1 more; each builds the same app over the engine
(serving/remote.py ``EngineLink``: the engine routes each reply to the process that took its request) and
listens on the same port with a socket of its own (SO_REUSEPORT), so the kernel spreads new connections over
the processes. Their counts meet in a shared directory (serving/api/share.py), so /metrics, the stats line and
``--max-queue`` speak for the whole server.

The others do not hear the terminal's Ctrl-C (a process group of their own): the first process tells them with
SIGTERM, on the first signal (drain) and on the second (stop at once), and waits for them before it stops the
engine. Each leaves with its parent, and on its own once the engine is gone.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait as wait_for_sentinels
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from core.errors import MinisglError
from minisgl_cli.serve.http import Site, http_server

READY_TIMEOUT_S = 300.0  # the tokenizer's load and the imports, on a slow disk
JOIN_GRACE_S = 10.0  # beyond the drain's own timeout, how long the first process waits for the others to leave


class ApiWorkerError(MinisglError):
    """Another API process could not start."""


@dataclass(frozen=True)
class WorkerPlan:
    """Everything one more API process needs to build the first one's server."""

    link: Any  # serving.remote.EngineLink
    config: Any  # core.config.EngineConfig
    model_dir: Path
    model_name: str
    max_queue: int | None
    site: Site
    share_dir: Path
    parent_pid: int
    address: tuple[str, int]  # where the first process listens: this one binds beside it (SO_REUSEPORT)


class ApiWorkers:
    """The first process's view of the others: started, awaited, told to stop, joined."""

    def __init__(self) -> None:
        self.processes: list[mp.Process] = []
        self._stopping = False

    def start(self, plans: list[WorkerPlan]) -> None:
        """Start one process a plan and wait until each serves (or raise the first one's error)."""
        context = mp.get_context("spawn")
        pipes = []
        for plan in plans:
            mine, theirs = context.Pipe(duplex=False)
            process = context.Process(target=worker_main, args=(plan, theirs),
                                      name=f"minisgl-api-{plan.link.client}")
            process.start()
            theirs.close()
            self.processes.append(process)
            pipes.append(mine)
        for process, pipe in zip(self.processes, pipes):
            error = pipe.recv() if pipe.poll(READY_TIMEOUT_S) else "it did not start in time"
            if error is not None:
                self.kill()
                raise ApiWorkerError(f"API process {process.name} failed to start: {error}")

    def watch(self, say: Callable[[str], None]) -> None:
        """On a thread: an API process that leaves while the server is not stopping is said in one line (its
        connections are refused from then on; the others serve on)."""
        def run() -> None:
            left = list(self.processes)
            while left:
                for sentinel in wait_for_sentinels([process.sentinel for process in left]):
                    process = next(p for p in left if p.sentinel == sentinel)
                    left.remove(process)
                    process.join()
                    if not self._stopping:
                        say(f"minisgl: API process {process.name.rsplit('-', 1)[-1]} (pid {process.pid}) exited "
                            f"with code {process.exitcode}; {len(left) + 1} serve on")

        threading.Thread(target=run, name="minisgl-api-watch", daemon=True).start()

    def signal(self) -> None:
        """The first process took a signal: each other one drains (first time) or stops at once (second)."""
        self._stopping = True
        for process in self.processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGTERM)

    def join(self, drain_s: float) -> None:
        """Wait for each to leave (a drain takes up to ``drain_s``), then make sure they are gone."""
        for process in self.processes:
            process.join(drain_s + JOIN_GRACE_S)
        self.kill()

    def kill(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
                process.join(5)


def worker_main(plan: WorkerPlan, ready: Connection) -> None:
    """One more API process: the same server over the same engine, until the first process says stop."""
    os.setpgrp()  # the terminal's Ctrl-C goes to the first process only, which tells this one
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from core.llm.heap import freeze_startup_heap
    from core.llm.orphan import exit_with_parent
    from minisgl_cli.jobs import quiet_transformers

    exit_with_parent(plan.parent_pid)
    err = Console(stderr=True, soft_wrap=True)
    try:
        from core.models.tokenizer import load_tokenizer
        from serving.api.bridge import EngineBridge
        from serving.api.share import SharedCounts
        from serving.remote import RemoteEngine
        from minisgl_cli.serve.listen import bind_listener

        listener = bind_listener(*plan.address, shared=True)
        quiet_transformers()
        remote = RemoteEngine(plan.config, plan.model_dir, load_tokenizer(plan.model_dir), link=plan.link)
        remote.start()
        share = SharedCounts(plan.share_dir, plan.link.client, plan.link.clients)
        bridge = EngineBridge(remote, plan.model_name, plan.max_queue, share=share)
        server = http_server(bridge, plan.site, err, announce=False)
    except BaseException as exc:  # noqa: BLE001 - told to the first process, which says it
        ready.send(f"{type(exc).__name__}: {exc}")
        os._exit(1)
    server.take_signals()
    share.start(bridge.counts)
    freeze_startup_heap()
    ready.send(None)
    try:
        server.run(sockets=[listener])
    finally:
        remote.stop()
        share.stop()
    os._exit(1 if server.engine_death is not None else 0)
