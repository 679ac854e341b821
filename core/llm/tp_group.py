"""Tensor-parallel worker processes, rank 0's side: started by the LLM, driven by rank 0, stopped on every way out.

Rank 0, the caller's process, tokenizes, decides every request's seed and reports the results; ranks 1..N-1 are
spawned here (core/llm/tp_worker.py is their side). Every rank builds its slice of the model and runs the same
scheduler loop on the same messages, so all form the same batch at every step. A watchdog thread waits on the
workers' process sentinels: when one exits unexpectedly it stops the others, so rank 0's pending collective
fails within moments rather than at the timeout, and rank 0 raises WorkerError naming the rank.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from contextlib import contextmanager
from multiprocessing.connection import wait as wait_for_sentinels
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from core.config import EngineConfig
from core.distributed.groups import abort_nccl, broadcast_object, free_port, init_groups, leave_groups
from core.distributed.info import TPInfo
from core.engine.engine import pick_device
from core.env import tp_timeout_s
from core.errors import InvalidParamsError, MinisglError, WorkerError
from core.llm.tp_worker import Command, worker_main
from core.models.loader import read_model_config

_STOP_JOIN_S = 10.0  # a worker told to stop gets this long to exit before it is terminated
_DEATH_NOTICE_S = 5.0  # after a failed collective, how long rank 0 waits for the watchdog to name a dead rank


class LocalGroup:
    """The single-rank case: nothing to start, share or guard."""

    info = TPInfo()

    def __init__(self, config: EngineConfig) -> None:
        self.config = config

    @contextmanager
    def guard(self) -> Iterator[None]:
        yield

    def wait_ready(self) -> None:
        pass

    def share(self, messages: list, eos_token_ids: frozenset[int]) -> list:
        return messages

    def close(self) -> None:
        pass


class TPGroup:
    """Rank 0's handle on the workers: start them, send them requests, notice their death, stop them."""

    def __init__(self, config: EngineConfig, model_dir: Path) -> None:
        if dist.is_initialized():
            raise InvalidParamsError("a tensor-parallel LLM is already running in this process; close() it first")
        if (problem := read_model_config(model_dir).tp_split_problem(config.tp)) is not None:
            raise InvalidParamsError(f"tp={config.tp}: {problem}; choose a tp size that divides them")
        self.size = config.tp
        self.info = TPInfo(0, self.size)
        self.backend = _backend_for(config)
        self.config = _rank_config(config, 0, self.backend)
        self.timeout_s = tp_timeout_s()
        self._failure: str | None = None
        self._failed = threading.Event()
        self._closing = False
        self._closed = False
        ctx = mp.get_context("spawn")
        self._errors = ctx.SimpleQueue()
        port = free_port()
        self._procs = [ctx.Process(target=worker_main, name=f"minisgl-tp-rank{rank}", daemon=True,
                                   args=(rank, self.size, port, self.backend, _rank_config(config, rank, self.backend),
                                         model_dir, self.timeout_s, os.getpid(), self._errors))
                       for rank in range(1, self.size)]
        self._watchdog = threading.Thread(target=self._watch, name="minisgl-tp-watchdog", daemon=True)
        try:
            for proc in self._procs:
                proc.start()
            self._watchdog.start()
        except BaseException:  # e.g. Ctrl-C while starting: take down whatever did start
            self.close(force=True)
            raise
        with self.guard():
            self._control = init_groups(0, self.size, port, self.backend, self.timeout_s)

    # ---- used by the engine -----------------------------------------------------------------------------
    @contextmanager
    def guard(self) -> Iterator[None]:
        """Run rank 0's side of a collective step; on any failure the workers are stopped, never left waiting. A
        failure caused by a dead or silent worker becomes WorkerError; rank 0's own errors (a callback that raised,
        Ctrl-C) pass through unchanged, after the shutdown."""
        if self._failure is not None:
            raise WorkerError(f"{self._failure}; create a new LLM")
        if self._closed:
            raise WorkerError("the tensor-parallel workers were shut down (closed, or stopped after an error); "
                              "create a new LLM")
        try:
            yield
        except BaseException as exc:
            problem = self._explain(exc)
            self.close(force=True)
            if problem is not None:
                raise WorkerError(problem) from exc
            raise

    def wait_ready(self) -> None:
        """Return once every rank has built its model (a worker that failed to has exited and is reported)."""
        dist.all_gather_object([None] * self.size, "ready", group=self._control)

    def share(self, messages: list, eos_token_ids: frozenset[int]) -> list:
        """Send the messages rank 0's loop took in before this step to every worker (rank 0 applies them too)."""
        broadcast_object(Command(tuple(messages), frozenset(eos_token_ids)), self._control)
        return messages

    def close(self, force: bool = False) -> None:
        """Stop the workers (politely unless ``force`` or after a failure), then tear the groups down."""
        if self._closed:
            return
        self._closed = self._closing = True
        polite = not force and self._failure is None
        if polite:
            try:
                broadcast_object(Command(stop=True), self._control)
            except Exception:  # noqa: BLE001 - a worker already gone; the terminate below covers it
                polite = False
            else:  # the workers leave the groups now too: NCCL's teardown wants every rank at it together
                leave_groups()
        started = [proc for proc in self._procs if proc.pid is not None]
        deadline = time.monotonic() + (_STOP_JOIN_S if polite else 0.0)
        for proc in started:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in started:
            _stop_process(proc)
        if self._watchdog.is_alive():
            self._watchdog.join()
        if not polite:
            if self.backend == "nccl":
                abort_nccl()
            leave_groups()
        self._errors.close()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    # ---- failure handling -------------------------------------------------------------------------------
    def _watch(self) -> None:
        """Wait on the workers' sentinels; on the first unexpected exit, record it and stop the rest."""
        sentinels = {proc.sentinel: rank for rank, proc in enumerate(self._procs, start=1)}
        while not self._closing:
            ready = wait_for_sentinels(list(sentinels), timeout=0.5)
            if not ready or self._closing:
                continue
            rank = sentinels[ready[0]]
            self._procs[rank - 1].join(1.0)  # reap it, so its exit code is known
            self._failure = self._describe_exit(rank, self._procs[rank - 1].exitcode)
            self._failed.set()
            for proc in self._procs:
                if proc.is_alive():
                    proc.kill()
            if self.backend == "nccl":
                abort_nccl()
            return

    def _describe_exit(self, rank: int, code: int | None) -> str:
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        reported = {}
        while not self._errors.empty():
            r, text = self._errors.get()
            reported.setdefault(r, text)
        detail = reported.get(rank)  # the others only saw their peer vanish
        return f"tensor-parallel worker rank {rank} {how}" + (f" ({detail})" if detail else "")

    def _explain(self, exc: BaseException) -> str | None:
        """Why a step failed, when a worker is to blame; None when the error is rank 0's own."""
        if isinstance(exc, (KeyboardInterrupt, MinisglError)):
            return None
        if self._failure is not None:
            return self._failure
        if not isinstance(exc, RuntimeError):
            return None
        text = str(exc).lower()
        if "timed out" in text or "timeout" in text:
            return (f"a tensor-parallel worker stopped answering within {self.timeout_s:g} s "
                    f"(MINISGL_TP_TIMEOUT): {exc}")
        if self._failed.wait(_DEATH_NOTICE_S):  # a peer's socket closed: the watchdog is about to name it
            return self._failure
        if isinstance(exc, dist.DistError):
            return f"tensor-parallel communication failed: {exc}"
        return None


# ---- starting the workers ----------------------------------------------------------------------------------
def _backend_for(config: EngineConfig) -> str:
    if pick_device(config.device).type != "cuda":
        return "gloo"
    if torch.cuda.device_count() < config.tp:
        raise InvalidParamsError(f"tp={config.tp} needs {config.tp} GPUs but {torch.cuda.device_count()} are visible")
    return "nccl"


def _rank_config(config: EngineConfig, rank: int, backend: str) -> EngineConfig:
    """On CUDA, rank r runs on GPU r."""
    return dataclasses.replace(config, device=f"cuda:{rank}") if backend == "nccl" else config


def _stop_process(proc: mp.Process) -> None:
    if proc.is_alive():
        proc.terminate()
        proc.join(2.0)
    if proc.is_alive():
        proc.kill()
    proc.join()
