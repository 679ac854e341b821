"""The inbox: the one way anything reaches a running scheduler from outside its loop.

Any thread may post messages (requests, aborts, cache resets, grammars compiled on a worker); only the loop takes
them, at the top of each step. With tensor parallelism rank 0 sends the list it took to every other rank, which
applies it at the same point of the same step: all ranks keep forming the same batches (a rank told a grammar is
ready waits for its own compile of it, started when the request arrived).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from core.constraint import Constraint
from core.request import SamplingParams


@dataclass(frozen=True)
class AddRequest:
    """A new request; its seed is already decided, so every rank samples it alike."""

    uid: int
    input_ids: tuple[int, ...]
    params: SamplingParams


@dataclass(frozen=True)
class AbortRequest:
    uid: int


@dataclass(frozen=True)
class ResetPrefixCache:
    pass


@dataclass(frozen=True)
class GrammarReady:
    """A constraint's grammar has been compiled on the grammars' worker thread (core/constrain/grammars.py), or
    found not to build: the requests queued under it can go on. Posted by the engine itself, never sent to it."""

    constraint: Constraint


Message = AddRequest | AbortRequest | ResetPrefixCache | GrammarReady


class Inbox:
    """A thread-safe FIFO of messages that a waiting loop can sleep on."""

    def __init__(self) -> None:
        self._messages: list[Message] = []
        self._ready = threading.Condition()

    def post(self, message: Message) -> None:
        with self._ready:
            self._messages.append(message)
            self._ready.notify_all()

    def take_all(self) -> list[Message]:
        with self._ready:
            messages, self._messages = self._messages, []
            return messages

    def discard_requests(self, uids: set[int]) -> None:
        """Drop requests (and their aborts) that were never taken in: their caller gave up on them."""
        with self._ready:
            self._messages = [m for m in self._messages if getattr(m, "uid", None) not in uids]

    @property
    def has_mail(self) -> bool:
        with self._ready:
            return bool(self._messages)

    def wait(self, timeout_s: float) -> None:
        """Sleep until a message is posted, ``wake()`` is called, or the timeout passes."""
        with self._ready:
            if not self._messages:
                self._ready.wait(timeout_s)

    def wake(self) -> None:
        with self._ready:
            self._ready.notify_all()
