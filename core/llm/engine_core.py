"""Rank 0's engine, the interface both clients use: the scheduler, its tensor-parallel ranks and the one loop.

Messages go in through ``post`` (requests, aborts, prefix-cache resets, from any thread); every step's replies
come out through ``send_result``. The ``LLM`` holds one in its own process; ``minisgl serve`` runs one in a
process of its own (serving/engine_process.py).
"""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from core.config import EngineConfig
from core.distributed.info import tp_scope
from core.errors import EngineBusyError
from core.llm.tp_group import LocalGroup, TPGroup
from core.scheduler.inbox import Message, ResetPrefixCache
from core.scheduler.reply import ReplySink
from core.scheduler.scheduler import Scheduler


class EngineCore:
    """The scheduler of rank 0 with ranks 1..N-1 started under it; ``close()`` stops them."""

    def __init__(self, config: EngineConfig, model_dir: Path, log: Callable[[str], None] | None,
                 send_result: ReplySink) -> None:
        self._group = TPGroup(config, model_dir) if config.tp > 1 else LocalGroup(config)
        weakref.finalize(self, self._group.close)
        with self._group.guard(), tp_scope(self._group.info):
            self.scheduler = Scheduler(self._group.config, model_dir, log, send_result=send_result,
                                       exchange=self._share)
            self._group.wait_ready()
        self._lock = threading.Lock()
        self._loop_thread: int | None = None  # the thread running the loop, while one does

    @property
    def pids(self) -> list[int]:
        """The tensor-parallel worker processes' ids (none with tp=1)."""
        return list(getattr(self._group, "pids", []))

    def post(self, message: Message) -> None:
        """From any thread: the loop takes it in before its next step."""
        self.scheduler.inbox.post(message)

    def _share(self, messages: list[Message]) -> list[Message] | None:
        return self._group.share(messages, self.scheduler.eos_token_ids)

    # ---- the loop ----------------------------------------------------------------------------------------
    def run_until_idle(self) -> None:
        """Run the loop on this thread until nothing is queued, running or posted."""
        with self._owning_the_loop():
            self.scheduler.run_until_idle()

    def serve_forever(self) -> None:
        """Run the loop on this thread until ``stop()``, waiting for messages when there are none; then it
        finishes every request already taken in and returns."""
        self.scheduler.stop_requested.clear()
        with self._owning_the_loop():
            self.scheduler.run_until_stopped()

    def stop(self) -> None:
        """Have ``serve_forever`` return once every request is answered. Safe from any thread."""
        self.scheduler.stop_requested.set()
        self.scheduler.inbox.wake()

    @property
    def loop_running_elsewhere(self) -> bool:
        return self._loop_thread is not None and self._loop_thread != threading.get_ident()

    @contextmanager
    def _owning_the_loop(self) -> Iterator[None]:
        """One loop at a time, on one thread; tensor-parallel failures inside it become WorkerError."""
        with self._lock:
            if self._loop_thread is not None:
                raise EngineBusyError("the engine loop is already running"
                                      + (" on another thread" if self.loop_running_elsewhere else ""))
            self._loop_thread = threading.get_ident()
        try:
            with self._group.guard():
                yield
        finally:
            self._loop_thread = None

    def reset_prefix_cache(self) -> int | None:
        """Empty the prefix cache on every rank (pages running requests read stay). With no loop running it
        happens now and returns the pages rank 0 freed; while a loop runs, before its next step, and None."""
        self.post(ResetPrefixCache())
        if self._loop_thread is not None:
            return None
        self.run_until_idle()
        return self.scheduler.pages_freed_by_last_reset

    def forget(self, uids: list[int]) -> None:
        """Drop requests whose caller gave up while no loop runs: unposted ones vanish, taken-in ones are freed
        (their 'abort' replies go to ``send_result`` as usual)."""
        self.scheduler.inbox.discard_requests(set(uids))
        if self._group.info.size == 1:  # with tp > 1 the failed loop's guard has already stopped the workers
            for uid in uids:
                self.scheduler.abort(uid)

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any."""
        if self._group.info.size > 1:
            self.scheduler.engine.release_cuda_graphs()  # they hold NCCL work: gone before the communicators are
        self._group.close()
