"""The engine in another process, as a client sees it: ``minisgl serve``'s API process holds one.

``RemoteEngine.start`` spawns the engine process (serving/engine_process.py), waits for it to be built (its
log lines go to ``log`` meanwhile) and then offers what the server needs of an engine: ``submit`` and
``abort`` (through the same Routes as the offline LLM, so tokenizing, incremental text and stop strings happen
here, off the engine's path), ``rejection`` (the engine's limits come with its ready message), ``stats`` (the
engine's numbers from its newest message) and step events for a trace.

Replies arrive on a receiver thread, one message a step; ``on_batch`` is called after each message's replies
have been delivered, so a server hands them to its event loop once a step, not once a token. A watchdog waits on
the engine process: if it dies, every open request is answered with an error, ``on_death`` is called and
every later submit raises EngineDeadError. ``close`` stops it on every way out.

Several API processes can share one engine (``serve --api-workers``): the first starts it for ``clients`` of them
and hands each other one an ``EngineLink``; a RemoteEngine made with it attaches (no process of its own: its
watchdog looks at the engine's pid, and stopping it closes only its sockets).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_for_sentinels
from pathlib import Path
from typing import Any, Callable

import zmq

from core import errors
from core.config import EngineConfig
from core.errors import EngineDeadError
from core.events import StepEvent
from core.generation import sampling_defaults
from serving.engine_process import engine_main
from core.llm.routes import ReplyCallback, Routes, tokenize
from serving.wire import EngineInfo, ReportRadix, Stop, StepOutput, pack_message, unpack_output
from core.request import SamplingParams
from core.scheduler.admission import Limits, rejection
from core.scheduler.inbox import Message

STOP_JOIN_S = 30.0  # after Stop, how long the engine gets to answer what it holds and exit
ATTACHED_WATCH_S = 0.25  # how often an attached client looks whether the engine is still there


@dataclass(frozen=True)
class EngineLink:
    """How one more API process reaches an engine that another started: the engine's inbox, the socket it
    sends this client's replies to, this client's place among the clients (its uids are ``client``,
    ``client + clients``, ...: the engine routes a reply by its uid) and the engine's ready message."""

    in_address: str
    out_address: str
    client: int
    clients: int
    ready: StepOutput


class RemoteEngine:
    def __init__(self, config: EngineConfig, model_dir: Path, tokenizer: Any = None, *, trace: bool = False,
                 first_uid: int = 0, uid_step: int = 1, threads: int | None = None, gpu: int | None = None,
                 clients: int = 1, link: EngineLink | None = None) -> None:
        """``first_uid``/``uid_step``: this engine's uids, disjoint from other engines' under data parallelism;
        ``threads``: torch's threads in the engine process (default torch's own); ``clients``: the API processes
        that will talk to the engine, this one first (each of the others attaches with ``link(i)``); ``link``:
        attach to an engine another process started (see ``link``) instead of starting one."""
        if link is not None:
            first_uid, uid_step = link.client, link.clients
        self.config = config
        self._threads = threads
        self._gpu = gpu
        self.model_dir = model_dir
        self.tokenizer = tokenizer
        # what a request that omits a sampling field gets (core/generation.py), decided here once
        self.sampling_defaults = sampling_defaults(model_dir if isinstance(model_dir, Path) else None,
                                                   config.generation_config, config.override_generation_config)
        self._trace = trace
        self._link = link
        self._dir = tempfile.mkdtemp(prefix="minisgl-") if link is None else None  # the owner's, removed by it
        self._in_address = link.in_address if link is not None else f"ipc://{self._dir}/in"
        self._out_addresses = [link.out_address] if link is not None else \
            [f"ipc://{self._dir}/out{i}" for i in range(clients)]
        self._out_address = self._out_addresses[0]
        self._context = zmq.Context()
        self._pull = self._context.socket(zmq.PULL)
        self._pull.bind(self._out_address)
        self._push = self._context.socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, 0)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push_lock = threading.Lock()
        self.info: EngineInfo | None = None
        self._limits: Limits | None = None
        self._eos: frozenset[int] = frozenset()
        self._stats: dict[str, Any] = {}
        self.routes = Routes(tokenizer, self._post, lambda: self._eos, first_uid, uid_step)
        self.step_callbacks: list[Callable[[StepEvent], None]] = []
        self.on_batch: Callable[[], None] | None = None
        self.on_death: Callable[[str], None] | None = None
        self.dead: str | None = None  # why the engine cannot answer any more
        self._stopping = False
        self._die_lock = threading.Lock()
        self._receiving = False
        self._submitted = 0
        self._process: mp.Process | None = None

    # ---- start and stop ------------------------------------------------------------------------------------
    def start(self, log: Callable[[str], None] | None = None,
              while_loading: Callable[[], None] | None = None) -> None:
        """Spawn the engine process and wait until it is built; its load errors are raised here, typed.
        ``while_loading`` runs as soon as the process is spawned, so that the caller's own loading (the
        tokenizer, ``give_tokenizer``) overlaps the engine's imports and model load rather than preceding them.
        Attached (``link``): the engine is built already; this client starts receiving."""
        if self._link is not None:
            self._push.connect(self._in_address)
            self._ready(self._link.ready)
            self._start_threads()
            return
        self._process = mp.get_context("spawn").Process(
            target=engine_main, name="minisgl-engine",
            args=(self.config, self.model_dir, self._in_address, self._out_addresses, self._trace, os.getpid(),
                  self._threads, self._gpu))
        self._process.start()
        self._push.connect(self._in_address)
        if while_loading is not None:
            while_loading()
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        while self.info is None:
            if not poller.poll(200):
                if not self._process.is_alive():
                    raise EngineDeadError(f"the engine process exited with code {self._process.exitcode} "
                                          f"while loading")
                continue
            out = unpack_output(self._pull.recv())
            if out.fatal is not None:
                self._process.join(5)
                kind, message = out.fatal
                error_type = getattr(errors, kind, None)
                if isinstance(error_type, type) and issubclass(error_type, errors.MinisglError):
                    raise error_type(message)
                raise EngineDeadError(f"the engine failed to start: {kind}: {message}")
            if out.log is not None and log is not None:
                log(out.log)
            if out.info is not None:
                self._ready(out)
        self._start_threads()

    def _start_threads(self) -> None:
        self._receiving = True
        threading.Thread(target=self._receive, name="minisgl-replies", daemon=True).start()
        threading.Thread(target=self._watch, name="minisgl-engine-watch", daemon=True).start()

    def link(self, client: int) -> EngineLink:
        """What API process ``client`` (1 ..; this one is 0) needs to attach to this engine once it is built."""
        return EngineLink(self._in_address, self._out_addresses[client], client, len(self._out_addresses),
                          StepOutput([], self._stats, info=self.info))

    def give_tokenizer(self, tokenizer: Any) -> None:
        """The tokenizer, where it was not given at construction (it loads while the engine does: ``start``)."""
        self.tokenizer = self.routes.tokenizer = tokenizer

    def _ready(self, out: StepOutput) -> None:
        info = out.info
        self.info = info
        self._limits = Limits(info.vocab_size, info.max_seq_len, info.page_size, info.num_pages)
        self._eos = frozenset(info.eos_token_ids)
        self._stats = out.stats or {}

    def stop(self, timeout_s: float = STOP_JOIN_S) -> None:
        """Have the engine answer every request it holds, then exit; wait for it (then make sure it is gone).
        Attached, only this client closes: the engine is its owner's to stop."""
        if self._process is None:
            if self._link is not None:
                self.close()
            return
        self._stopping = True
        if self.dead is None:
            self._post(Stop())
            self._process.join(timeout_s)
        self.close()

    def close(self) -> None:
        """The engine process is gone after this, whatever it was doing."""
        self._stopping = True
        process = self._process
        if process is not None and process.is_alive():
            process.kill()
            process.join(5)
        if self._context.closed:
            return
        with self._push_lock:
            self._push.close(linger=0)
        if not self._receiving:  # else the receiver closes its socket when term() interrupts its recv
            self._pull.close(linger=0)
        self._context.term()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    # ---- what the server asks --------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        if self._process is not None:
            return self._process.pid
        return self.info.pid if self._link is not None and self.info is not None else None

    @property
    def pids(self) -> list[int | None]:
        return [self.pid]

    @property
    def worker_pids(self) -> list[list[int]]:
        """Each engine's tensor-parallel ranks 1..N-1 (processes under the engine process)."""
        return [list(self.info.worker_pids) if self.info is not None else []]

    @property
    def placed(self) -> list[int]:
        """Requests submitted so far (one engine: all of them)."""
        return [self._submitted]

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    @property
    def max_seq_len(self) -> int:
        return self.info.max_seq_len

    @property
    def capacity_tokens(self) -> int:
        return self._limits.capacity_tokens

    def stats(self) -> dict[str, Any]:
        return dict(self._stats)

    def rejection(self, input_ids: list[int], params: SamplingParams) -> errors.RequestRejected | None:
        return rejection(input_ids, params, self._limits)

    def submit(self, input_ids: list[int], params: SamplingParams, *, on_reply: ReplyCallback | None = None,
               text: bool = False) -> int:
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        self._submitted += 1
        return self.routes.add(list(input_ids), params, on_reply, text)

    def abort(self, uid: int) -> bool:
        return self.routes.abort(uid)

    def tokenize(self, prompt: Any) -> list[int]:
        return tokenize(self.tokenizer, prompt)

    def abort_all(self) -> int:
        """Abort every open request (a drain that ran out of time); returns how many."""
        uids = self.routes.open_uids()
        return sum(self.routes.abort(uid) for uid in uids)

    @property
    def unanswered(self) -> int:
        return self.routes.unanswered

    def add_step_callback(self, fn: Callable[[StepEvent], None]) -> None:
        self.step_callbacks.append(fn)

    def report_radix(self, on: bool) -> None:
        """Have the engine's step events carry the radix tree (from its next step) or stop carrying it."""
        self._post(ReportRadix(on))

    # ---- the threads ---------------------------------------------------------------------------------------
    def _post(self, message: Message | Stop | ReportRadix) -> None:
        data = pack_message(message)
        with self._push_lock:
            if not self._push.closed:
                self._push.send(data)

    def _receive(self) -> None:
        try:
            while True:
                out = unpack_output(self._pull.recv())
                if out.stats is not None:
                    self._stats = out.stats
                if out.fatal is not None:
                    self._die(f"the engine process failed: {out.fatal[1]}")
                    return
                if out.replies:
                    self.routes.deliver(out.replies)
                if out.event is not None:
                    for fn in self.step_callbacks:
                        fn(out.event)
                if self.on_batch is not None and out.replies:
                    self.on_batch()
        except zmq.ContextTerminated:
            pass
        finally:  # this thread's socket: closed here, so that close() can end the context
            self._pull.close(linger=0)

    def _watch(self) -> None:
        process = self._process
        if process is None:  # attached: the engine is another process's child, so its pid is all there is
            while not self._stopping and _alive(self.info.pid):
                time.sleep(ATTACHED_WATCH_S)
            if not self._stopping:
                self._die(f"the engine process (pid {self.info.pid}) died")
            return
        wait_for_sentinels([process.sentinel])
        process.join()  # the sentinel can wake before the exit is reapable: reaped here, its code known
        if not self._stopping:
            self._die(f"the engine process (pid {process.pid}) died with exit code {process.exitcode}")

    def _die(self, why: str) -> None:
        with self._die_lock:  # the receiver (a fatal message) and the watchdog (the exit) may both see it
            if self.dead is not None:
                return
            self.dead = why
        self.routes.fail_all(why)
        if self.on_batch is not None:
            self.on_batch()
        if self.on_death is not None:
            self.on_death(why)


def _alive(pid: int) -> bool:
    """``pid`` runs: it exists and has not exited (a zombie, exited but not yet reaped by its parent, has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # there, under another user
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:  # no /proc (not Linux): its parent reaps it at once
        return True
