"""A client's side of the engine interface: every request it submitted and not yet saw answered.

Both clients of the engine use it: the offline ``LLM`` (the engine in its own process) and ``minisgl serve``'s
API process (the engine in another, serving/remote.py). It gives each request its uid and, if it has none, its
seed (the client decides every seed, so tensor-parallel ranks sample alike), follows its text when asked
(incremental detokenizing and stop strings, core/llm/text.py: a stop string ends the request with 'stop' and
aborts it in the engine) and hands every reply to the request's callback exactly once, the final one last.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from core.errors import InvalidParamsError
from core.llm.text import TextStream
from core.request import SamplingParams
from core.scheduler.inbox import AbortRequest, AddRequest, Message
from core.scheduler.reply import Reply

ReplyCallback = Callable[[Reply], None]


@dataclass
class _Route:
    """Where a request's replies go, and its text when the client follows it (stop strings, or asked for)."""

    on_reply: ReplyCallback | None
    text: TextStream | None = None


class Routes:
    """Thread-safe: ``add`` and ``abort`` from any thread, ``deliver`` from the thread that receives replies.
    ``post`` sends a message to the engine. Uids are ``first``, ``first + step``, ...: several API processes
    share one engine with disjoint uids."""

    def __init__(self, tokenizer: Any, post: Callable[[Message], None], eos_token_ids: Callable[[], frozenset[int]],
                 first_uid: int = 0, uid_step: int = 1) -> None:
        self.tokenizer = tokenizer
        self._post = post
        self._eos = eos_token_ids
        self._lock = threading.RLock()  # guards the uid counter, the routes and the seed generator
        self._next_uid = first_uid
        self._uid_step = uid_step
        self._rng = random.Random()
        self._routes: dict[int, _Route] = {}
        self.callbacks: list[ReplyCallback] = []  # every reply of every request, after its own callback

    def add(self, input_ids: list[int], params: SamplingParams, on_reply: ReplyCallback | None,
            text: bool = False) -> int:
        stream = TextStream(self.tokenizer, input_ids, params.stop) if text or params.stop else None
        with self._lock:
            uid = self._next_uid
            self._next_uid += self._uid_step
            self._routes[uid] = _Route(on_reply, stream)
            if params.seed is None:
                params = dataclasses.replace(params, seed=self._rng.getrandbits(62))
        self._post(AddRequest(uid, tuple(input_ids), params))
        return uid

    def abort(self, uid: int) -> bool:
        """True if ``uid`` was unanswered: the engine is told, and its final 'abort' reply is delivered now."""
        with self._lock:
            if uid not in self._routes:
                return False
            self._post(AbortRequest(uid))
            self._deliver(Reply(uid, None, True, "abort"))
        return True

    def forget(self, uids: Iterable[int]) -> None:
        """Drop requests without answering them (their caller gave up)."""
        with self._lock:
            for uid in uids:
                self._routes.pop(uid, None)

    def deliver(self, replies: list[Reply]) -> None:
        with self._lock:
            for reply in replies:
                if reply.uid in self._routes:  # else unknown, or already answered (aborted)
                    self._deliver(reply)

    def fail_all(self, error: str) -> None:
        """Answer every open request with an error: the engine can no longer answer them."""
        with self._lock:
            for uid in list(self._routes):
                self._deliver(Reply(uid, None, True, "error", error))

    @property
    def unanswered(self) -> int:
        with self._lock:
            return len(self._routes)

    def open_uids(self) -> list[int]:
        with self._lock:
            return list(self._routes)

    def _deliver(self, reply: Reply) -> None:
        route = self._routes[reply.uid]
        if route.text is not None:
            reply = self._with_text(reply, route.text)
        if reply.finished:
            del self._routes[reply.uid]
        if route.on_reply is not None:
            route.on_reply(reply)
        for fn in self.callbacks:
            fn(reply)

    def _with_text(self, reply: Reply, stream: TextStream) -> Reply:
        """The reply with the text its token adds; a stop string turns it into the request's final reply and
        has the engine free the request before its next step (on every rank, like any abort)."""
        pieces = []
        if reply.token is not None and reply.token not in self._eos() and not reply.ended_on_token:
            piece = stream.add(reply.token)
            pieces.append(piece.text)
            if piece.stop is not None:
                if not reply.finished:
                    self._post(AbortRequest(reply.uid))
                return dataclasses.replace(reply, finished=True, finish_reason="stop", text=piece.text,
                                           stop_string=piece.stop)
        if reply.finished:
            pieces.append(stream.finish().text)
        return reply.with_text("".join(pieces))


def tokenize(tokenizer: Any, prompt: Any) -> list[int]:
    """A prompt's token ids: text through the tokenizer, a list of token ids as it is."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    if isinstance(prompt, (list, tuple)) and _all_token_ids(prompt):
        return list(prompt)
    raise InvalidParamsError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")


def _all_token_ids(prompt: list | tuple) -> bool:
    """Every item an int and none a bool. The types are collected in C first, which a long workload's prompts
    need; subclasses of int take the slow check."""
    if set(map(type, prompt)) <= {int}:
        return True
    return all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
