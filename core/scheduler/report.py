"""What a step event tells a watcher beyond the batch itself: why each queued request waits, how the KV pool is
split between requests, the prefix cache and free pages, and the radix tree. Only built when someone registered
for step events; the scheduler's decisions never depend on any of it."""

from __future__ import annotations

import time
from typing import Callable, Iterable

from core.events import KVUsage, RadixNodeView, ReqStep, StepCallback, StepEvent, WaitReason
from core.kvcache.prefix import PrefixCache
from core.request import Batch, Req
from core.scheduler.cache import CacheManager
from core.scheduler.prefill import PendingReq, PrefillManager
from core.scheduler.step import Prepared, StepReport

FIRST_TOKENS_SHOWN = 8


def wait_reasons(queued: Iterable[PendingReq], refusal: WaitReason | None, forced_note: str) -> tuple[WaitReason, ...]:
    """Every request still queued after the batch was formed: the one tried last has the reason it was refused;
    those behind it wait their turn (first come, first served), or all of them wait for a forced decode; one
    whose grammar is being compiled waits for that alone."""
    reasons: list[WaitReason] = []
    head: int | None = None
    for pending in queued:
        if pending.awaits_grammar:
            reasons.append(WaitReason(pending.uid, "grammar", "its grammar is being compiled on a worker thread "
                                      "(requests behind it go ahead meanwhile)"))
        elif pending.preemptions and pending.admitted is None:
            reasons.append(preempted_reason(pending, refusal))
            head = pending.uid if refusal is not None and pending.uid == refusal.uid else head
        elif forced_note:
            reasons.append(WaitReason(pending.uid, "forced_decode", f"this step is a {forced_note}, so "
                                      "running requests are not starved"))
        elif refusal is not None and pending.uid == refusal.uid:
            reasons.append(refusal)
            head = pending.uid
        elif head is not None:
            reasons.append(WaitReason(pending.uid, "fcfs", f"behind uid{head}, which did not fit "
                                      "(first come, first served: nobody jumps the queue)"))
    return tuple(reasons)


def preempted_reason(pending: PendingReq, refusal: WaitReason | None) -> WaitReason:
    """A preempted request waits to be recomputed; if it was tried in this step, also why it did not fit."""
    times = f" {pending.preemptions} times" if pending.preemptions > 1 else ""
    text = (f"preempted{times} when the KV pool ran out (the newest running request gives way); its "
            f"{len(pending.output_ids)} tokens are kept and recomputed from the prefix cache when it fits again")
    if refusal is None or refusal.uid != pending.uid:
        return WaitReason(pending.uid, "preempted", text)
    return WaitReason(pending.uid, "preempted", f"{text}; now: {refusal.text}", refusal.pages_needed,
                      refusal.pages_free, refusal.pages_evictable)


def kv_usage(running: Iterable[Req], cache: PrefixCache, total: int) -> KVUsage:
    """Each running request's own pages (those the prefix cache does not own), the cache's, and the rest free
    (or freed by a step still in flight, which is as good as free for whoever looks)."""
    by_request = tuple(sorted((req.uid, len(req.pages) - cache.owned_prefix_pages(req.cache_handle))
                              for req in running))
    cached = cache.cached_pages
    return KVUsage(by_request, cached, total - cached - sum(pages for _, pages in by_request), total)


def radix_view(running: Iterable[Req], cache: PrefixCache) -> tuple[RadixNodeView, ...]:
    holders: dict[int, list[int]] = {}
    for req in sorted(running, key=lambda r: r.uid):
        for node_id in cache.path_ids(req.cache_handle):
            holders.setdefault(node_id, []).append(req.uid)
    return tuple(RadixNodeView(s.node_id, s.parent_id, len(s.tokens), s.tokens[:FIRST_TOKENS_SHOWN], s.pages,
                               s.lock_count, tuple(holders.get(s.node_id, ()))) for s in cache.spans())


def step_event(step: int, prepared: Prepared, finished: tuple[int, ...], elapsed_s: float, kv_pages_total: int,
               tp_size: int, radix: tuple[RadixNodeView, ...] | None, started_s: float) -> StepEvent:
    """The event for a finished step, from what was recorded when it was scheduled."""
    batch, report = prepared.batch, prepared.report
    return StepEvent(
        step=step, phase=batch.phase, batch_size=batch.size,
        num_tokens=len(batch.positions) if batch.is_prefill else batch.size, reqs=report.req_steps,
        kv_pages_used=report.pages_used, kv_pages_total=kv_pages_total, elapsed_s=elapsed_s, tp_size=tp_size,
        note=report.note, finished=finished, waiting=report.waiting, kv_pages_cached=report.pages_cached,
        arrived=report.arrived, waits=report.waits, kv=report.kv, evicted_pages=report.evicted_pages,
        radix=radix, started_s=started_s, mask_fill_s=prepared.mask_fill_s, mask_wait_s=prepared.mask_wait_s,
        preempted=report.preempted, preempted_pages=report.preempted_pages)


class StepReporter:
    """Records each step as it is scheduled and hands its event to the step callbacks when its result is in.
    ``running`` gives the requests that hold rows and pages (for the KV split and the radix holders)."""

    def __init__(self, cache: CacheManager, prefill: PrefillManager, tp_size: int,
                 running: Callable[[], set[Req]]) -> None:
        self.cache, self.prefill, self.tp_size, self.running = cache, prefill, tp_size, running
        self.callbacks: list[StepCallback] = []
        self.report_radix = False  # events carry the radix tree (set by watchers that draw it)
        self.arrived: list[int] = []  # uids queued since the last scheduled step
        self._step = 0  # steps reported so far
        self._evicted_reported = 0
        self._born = time.perf_counter()
        self._last_result_at = 0.0

    def record(self, batch: Batch, note: str, waiting: int, started: float,
               preempted: tuple[tuple[int, ...], int]) -> StepReport:
        """What the step event will say of a step just prepared, with the requests preempted to make room for it
        and the pages they gave back; the per-request detail only when watched."""
        arrived, self.arrived = tuple(self.arrived), []
        report = StepReport(req_steps=(), note=note, waiting=waiting, pages_used=self.cache.used_pages,
                            pages_cached=self.cache.cached_pages, started=started, arrived=arrived,
                            preempted=preempted[0], preempted_pages=preempted[1])
        if not self.callbacks:
            return report
        report.req_steps = tuple(ReqStep(r.uid, r.extend_len, r.cached_len, r.matcher is not None) for r in batch.reqs)
        in_batch = {r.uid for r in batch.reqs}
        queued = [p for p in self.prefill.pending if p.uid not in in_batch]
        report.waits = wait_reasons(queued, self.prefill.refusal, note if batch.is_decode else "")
        report.kv = kv_usage({*self.running(), *batch.reqs}, self.cache.prefix_cache, self.cache.num_pages)
        evicted = self.cache.evicted_pages
        report.evicted_pages, self._evicted_reported = evicted - self._evicted_reported, evicted
        return report

    def emit(self, prepared: Prepared, finished: tuple[int, ...]) -> None:
        """Report a step whose result is in. Its time runs from when it was scheduled, or, when steps overlap,
        from the previous step's result: the time between results, what a step costs once the pipeline is full."""
        now = time.perf_counter()
        started = prepared.report.started
        elapsed = now - max(started, self._last_result_at)
        self._last_result_at = now
        step, self._step = self._step, self._step + 1
        if not self.callbacks:
            return
        radix = radix_view(self.running(), self.cache.prefix_cache) if self.report_radix else None
        event = step_event(step, prepared, finished, elapsed, self.cache.num_pages, self.tp_size, radix,
                           started - self._born)
        for fn in self.callbacks:
            fn(event)
