"""Between the HTTP side (one asyncio loop) and the engine (a process of its own, serving/remote.py).

A request goes in with ``RemoteEngine.submit`` (returns at once); its replies come back on the receiver thread,
one message a step, and are handed to the asyncio loop together, with one ``call_soon_threadsafe`` a step, into
each request's own queue. So the HTTP side never waits on the engine and the engine never waits on a client: a
slow or vanished client only leaves replies in its queue, and a disconnect aborts its request, which frees its
row and pages before the next step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from core import SamplingParams
from core.errors import ContextLengthError, EngineDeadError
from serving.remote import RemoteEngine
from core.scheduler.reply import Reply
from serving.api.metrics import Metrics
from serving.api.protocol import ApiError
from serving.api.share import SharedCounts

RETRY_AFTER_S = 1
RECENT = 4096  # requests whose facts a dashboard can still ask for


@dataclass
class Tracked:
    """One request as the server follows it: its replies' queue and the times its metrics need."""

    prompt_ids: list[int]
    params: SamplingParams
    arrived: float
    queue: asyncio.Queue  # its replies, shared with the other choices of its HTTP request; None: the client has gone
    uid: int = -1
    last_token_at: float | None = None
    first_token_at: float | None = None
    finished: bool = False
    completion_tokens: int = 0
    finish_reason: str | None = None
    text: list[str] | None = None  # the completion so far, kept only for a dashboard that shows text


class EngineBridge:
    def __init__(self, llm: RemoteEngine, model_name: str, max_queue: int | None = None,
                 keep_text: bool = False, share: SharedCounts | None = None) -> None:
        """``share``: where this process's counts meet those of the server's other API processes, if any."""
        self.llm = llm
        self.share = share
        self.keep_text = keep_text
        self.recent: OrderedDict[int, Tracked] = OrderedDict()  # by uid, the newest RECENT requests
        self.model_name = model_name
        self.max_queue = max_queue
        self.metrics = Metrics()
        self.created = int(time.time())
        self._lock = threading.Lock()
        self._waiting = 0  # submitted, no reply yet: queued in the engine or in its first prefill
        self._in_flight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self.capacity_tokens = llm.capacity_tokens
        self._pending: list[tuple[Tracked, Reply]] = []  # replies received, not yet in their queues
        llm.on_batch = self._hand_over

    # ---- requests in (the asyncio loop) ------------------------------------------------------------------
    def start(self, prompt_ids: list[int], params: SamplingParams, queue: asyncio.Queue) -> Tracked:
        """Submit a request, its replies to go into ``queue``; the 400 for one that can never run and the 503 for
        a full queue come from here."""
        if self.llm.dead is not None:
            raise ApiError(503, f"the engine is not running: {self.llm.dead}", kind="server_error",
                           code="engine_dead")
        reason = self.llm.rejection(prompt_ids, params)
        if reason is not None:
            too_long = isinstance(reason, ContextLengthError)
            raise ApiError(400, str(reason), param=reason.param, code="context_length_exceeded" if too_long else None)
        too_large = next((f.name for f in dataclasses.fields(params)
                          if isinstance(getattr(params, f.name), int) and abs(getattr(params, f.name)) >= 2 ** 63),
                         None)
        if too_large is not None:  # it could not be sent to the engine
            raise ApiError(400, f"'{too_large}' is out of range (a 64-bit integer)", param=too_large)
        elsewhere = self.share.waiting_elsewhere() if self.share is not None else 0
        with self._lock:
            if self.max_queue is not None and self._waiting + elsewhere >= self.max_queue:
                raise ApiError(503, f"the server's queue is full ({self._waiting + elsewhere} requests waiting); "
                                    "retry later",
                               kind="server_overloaded", code="queue_full",
                               headers={"Retry-After": str(RETRY_AFTER_S)})
            self._waiting += 1
            self._in_flight += 1
        self._loop = self._loop or asyncio.get_running_loop()
        tracked = Tracked(prompt_ids, params, time.perf_counter(), queue, text=[] if self.keep_text else None)
        with self.metrics.lock:
            self.metrics.prompt_tokens += len(prompt_ids)
        try:
            tracked.uid = self.llm.submit(prompt_ids, params, text=True,
                                          on_reply=lambda reply: self._on_reply(tracked, reply))
        except EngineDeadError as exc:
            with self._lock:
                self._waiting -= 1
                self._in_flight -= 1
            raise ApiError(503, f"the engine is not running: {exc}", kind="server_error", code="engine_dead") from None
        with self._lock:
            self.recent[tracked.uid] = tracked
            while len(self.recent) > RECENT:
                self.recent.popitem(last=False)
        return tracked

    def facts(self, uid: int) -> dict[str, Any] | None:
        """What a dashboard shows of one request: its token counts, and its text (dropped there unless shown)."""
        with self._lock:
            tracked = self.recent.get(uid)
        if tracked is None:
            return None
        out: dict[str, Any] = {"prompt_tokens": len(tracked.prompt_ids), "completion_tokens": tracked.completion_tokens,
                               "finish_reason": tracked.finish_reason}
        if tracked.text is not None:
            out["prompt"] = self.llm.tokenizer.decode(tracked.prompt_ids)
            out["completion"] = "".join(tracked.text)
        return out

    def abort(self, tracked: Tracked) -> None:
        """The client went away: free its request now (the final 'abort' reply still updates the metrics)."""
        if not tracked.finished:
            self.llm.abort(tracked.uid)
            self._hand_over()

    def abort_all(self) -> int:
        """A drain that ran out of time: every open request ends with 'abort' (a last chunk, then [DONE])."""
        n = self.llm.abort_all()
        self._hand_over()
        return n

    def default_max_tokens(self, prompt_len: int) -> int:
        """When a request sets no max_tokens: whatever the context and the KV pool leave (at least 1)."""
        return max(1, self.capacity_tokens - prompt_len)

    # ---- replies out (the receiver thread) ----------------------------------------------------------------
    def _hand_over(self) -> None:
        """Once a step: every reply received goes to the asyncio loop in one call."""
        with self._lock:
            pending, self._pending = self._pending, []
        if pending and self._loop is not None:
            self._loop.call_soon_threadsafe(_into_queues, pending)

    def _on_reply(self, tracked: Tracked, reply: Reply) -> None:
        now = time.perf_counter()
        metrics = self.metrics
        answered_first = tracked.last_token_at is None and (reply.token is not None or reply.finished)
        with metrics.lock:
            if reply.token is not None:
                metrics.generated_tokens += 1
                tracked.completion_tokens += 1
                if tracked.last_token_at is None:
                    metrics.ttft.observe(now - tracked.arrived)
                    metrics.recent_ttft.append(now - tracked.arrived)
                    tracked.first_token_at = now
                else:
                    metrics.inter_token.observe(now - tracked.last_token_at)
            if reply.finished:
                metrics.requests[reply.finish_reason or "error"] = metrics.requests.get(
                    reply.finish_reason or "error", 0) + 1
                metrics.request_latency.observe(now - tracked.arrived)
                if tracked.first_token_at is not None and tracked.completion_tokens > 1:
                    metrics.recent_tpot.append((now - tracked.first_token_at) / (tracked.completion_tokens - 1))
        if tracked.text is not None and reply.text:
            tracked.text.append(reply.text)
        if reply.token is not None or reply.finished:
            tracked.last_token_at = now
        if reply.finished:
            tracked.finished = True
            tracked.finish_reason = reply.finish_reason
        with self._lock:
            self._waiting -= answered_first
            self._in_flight -= reply.finished
            self._pending.append((tracked, reply))

    # ---- state for /metrics -------------------------------------------------------------------------------
    def totals(self) -> Metrics:
        """The server's counts: this process's, and with other API processes theirs added."""
        if self.share is None:
            return self.metrics
        self.share.read()
        return self.metrics.plus([other["metrics"] for other in self.share.others])

    def counts(self) -> dict[str, Any]:
        """What this process tells the others (share.py)."""
        with self._lock:
            waiting, in_flight = self._waiting, self._in_flight
        return {"metrics": self.metrics.snapshot(), "waiting": waiting, "in_flight": in_flight}

    def gauges(self) -> dict[str, tuple[float, str]]:
        stats = self.llm.stats()
        running = stats["total_rows"] - stats["free_rows"]
        with self._lock:
            waiting, in_flight = self._waiting, self._in_flight
        if self.share is not None:
            waiting += self.share.waiting_elsewhere()
            in_flight += self.share.in_flight_elsewhere()
        used = stats["total_pages"] - stats["free_pages"]
        return {
            "requests_running": (running, "Requests holding a table row (prefilling or decoding)."),
            "requests_waiting": (waiting, "Requests taken in that have not produced their first token."),
            "requests_in_flight": (in_flight, "Requests taken in and not yet answered."),
            "kv_pages_used": (used, "KV pages not free: held by requests or by the prefix cache."),
            "kv_pages_cached": (stats["cached_pages"], "KV pages the prefix cache owns."),
            "kv_pages_free": (stats["free_pages"], "KV pages free."),
            "kv_pages_total": (stats["total_pages"], "KV pages in the pool."),
            "prefix_cache_hit_rate": (stats["hit_rate"], "Prompt tokens read from the prefix cache / prompt tokens."),
            "preemptions_total": (stats.get("preemptions", 0), "Requests preempted when the KV pool ran out (their "
                                  "pages given back, recomputed later)."),
        }

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def open_responses(self) -> int:
        """Requests taken in and not yet answered, by this API process and the others."""
        if self.share is None:
            return self.in_flight
        self.share.read()
        return self.in_flight + self.share.in_flight_elsewhere()

    def info(self) -> dict[str, Any]:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "minisgl",
                "max_model_len": self.llm.max_seq_len}


def _into_queues(pending: list[tuple[Tracked, Reply]]) -> None:
    for tracked, reply in pending:
        tracked.queue.put_nowait(reply)
