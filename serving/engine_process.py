"""The engine in a process of its own: what ``minisgl serve`` runs beside its API process.

The process builds an ``EngineCore`` (with its tensor-parallel ranks under it) and runs its loop on the main
thread, doing nothing else. A receiver thread takes the clients' messages off a ZMQ socket and posts them to
the engine's inbox; each step's replies leave as one message (serving/wire.py) on the socket of the client
that sent each request (uid modulo the number of clients), sent without waiting: the loop never blocks on a
client. While it loads, its log lines go to the first client; once built it tells every client its limits.

It ignores Ctrl-C (the API process decides when to stop, and says so with a Stop message: every request taken
in is answered first), exits when its parent disappears, and on an error it cannot go on from (a model that
does not load, a tensor-parallel rank that died) tells the clients in one fatal message and exits 1.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any, NoReturn

import zmq

from core.config import EngineConfig
from core.llm.heap import freeze_startup_heap
from core.llm.orphan import exit_with_parent
from core.scheduler.reply import Reply
from serving.wire import EngineInfo, ReportRadix, Stop, StepOutput, pack_output, unpack_message


class Outbox:
    """One PUSH socket per client (API process); replies go to the client whose uid space they are in."""

    def __init__(self, context: zmq.Context, addresses: list[str]) -> None:
        self.sockets = []
        for address in addresses:
            socket = context.socket(zmq.PUSH)
            socket.setsockopt(zmq.SNDHWM, 0)  # never block the loop: a slow client's messages queue up
            socket.setsockopt(zmq.LINGER, 2000)
            socket.connect(address)
            self.sockets.append(socket)
        self.stats: Any = None  # a callable for the engine's numbers, once it is built

    def replies(self, replies: list[Reply]) -> None:
        n = len(self.sockets)
        stats = self.stats() if self.stats is not None else None
        if n == 1:
            self._send(0, StepOutput(replies, stats))
            return
        mine: list[list[Reply]] = [[] for _ in range(n)]
        for reply in replies:  # one pass, whatever the number of clients
            mine[reply.uid % n].append(reply)
        for client in range(n):  # each client, replies or not: the engine's numbers are every client's to report
            self._send(client, StepOutput(mine[client], stats))

    def to_all(self, out: StepOutput) -> None:
        for client in range(len(self.sockets)):
            self._send(client, out)

    def _send(self, client: int, out: StepOutput) -> None:
        self.sockets[client].send(pack_output(out), copy=False)  # only the loop's thread sends


def engine_main(config: EngineConfig, model_dir: Path, in_address: str, out_addresses: list[str], trace: bool,
                parent_pid: int, threads: int | None = None, gpu: int | None = None) -> None:
    """The engine process's whole life: build, announce, serve until told to stop, exit. ``gpu``: under data
    parallelism, the one GPU (of those visible) this engine uses, set before torch is imported."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent(parent_pid)
    if gpu is not None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        choices = visible.split(",") if visible else None
        os.environ["CUDA_VISIBLE_DEVICES"] = choices[gpu] if choices and gpu < len(choices) else str(gpu)
    if threads is not None:  # engines side by side on one CPU share its cores
        import torch

        torch.set_num_threads(threads)
    context = zmq.Context()
    outbox = Outbox(context, out_addresses)
    try:
        from core.llm.engine_core import EngineCore

        def log(text: str) -> None:
            outbox._send(0, StepOutput([], log=text))

        core = EngineCore(config, model_dir, log, outbox.replies)
    except BaseException as exc:  # noqa: BLE001 - the client turns it into its own error type
        _fatal(outbox, context, exc)
    scheduler = core.scheduler
    outbox.stats = scheduler.stats
    if trace:
        scheduler.add_step_callback(lambda event: outbox.to_all(StepOutput([], event=event)))
    inbox = context.socket(zmq.PULL)
    inbox.bind(in_address)
    threading.Thread(target=_receive, args=(inbox, core), name="minisgl-engine-in", daemon=True).start()
    engine = scheduler.engine
    info = EngineInfo(scheduler.vocab_size, scheduler.max_seq_len, scheduler.page_size,
                      scheduler.cache_manager.num_pages, tuple(sorted(scheduler.eos_token_ids)), engine.describe(),
                      engine.precision_note, os.getpid(), tuple(core.pids))
    freeze_startup_heap()
    outbox.to_all(StepOutput([], stats=scheduler.stats(), info=info))
    try:
        core.serve_forever()
    except BaseException as exc:  # noqa: BLE001
        _fatal(outbox, context, exc)
    outbox.to_all(StepOutput([], stats=scheduler.stats()))
    core.close()
    _leave(outbox, context, 0)


def _receive(inbox: zmq.Socket, core: Any) -> None:
    try:
        while True:
            message = unpack_message(inbox.recv())
            if isinstance(message, Stop):
                core.stop()
            elif isinstance(message, ReportRadix):
                core.scheduler.report_radix = message.on  # read once per step by the loop: a flag is enough
            else:
                core.post(message)
    except zmq.ContextTerminated:  # the process is leaving
        inbox.close(linger=0)


def _fatal(outbox: Outbox, context: zmq.Context, exc: BaseException) -> NoReturn:
    text = str(exc).strip().splitlines()
    outbox.to_all(StepOutput([], fatal=(type(exc).__name__, text[0] if text else type(exc).__name__)))
    _leave(outbox, context, 1)


def _leave(outbox: Outbox, context: zmq.Context, code: int) -> NoReturn:
    """Exit once what is queued for the clients has gone out (or after the linger): closing the sockets and
    ending the context waits for that, and interrupts the receiver thread's wait."""
    for socket in outbox.sockets:
        socket.close(linger=2000)
    context.term()
    os._exit(code)  # nothing left to tear down: skip the slow interpreter shutdown
