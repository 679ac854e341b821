"""What a step event tells a watcher beyond the batch itself: why each queued request waits, how the KV pool is
split between requests, the prefix cache and free pages, and the radix tree. Only built when someone registered
for step events; the scheduler's decisions never depend on any of it."""

from __future__ import annotations

from typing import Iterable

from core.events import KVUsage, RadixNodeView, StepEvent, WaitReason
from core.kvcache.prefix import PrefixCache
from core.request import Req
from core.scheduler.prefill import PendingReq
from core.scheduler.step import Prepared

FIRST_TOKENS_SHOWN = 8


def wait_reasons(queued: Iterable[PendingReq], refusal: WaitReason | None, forced_note: str) -> tuple[WaitReason, ...]:
    """Every request still queued after the batch was formed: the one tried last has the reason it was refused;
    those behind it wait their turn (first come, first served), or all of them wait for a forced decode."""
    reasons: list[WaitReason] = []
    head: int | None = None
    for pending in queued:
        if forced_note:
            reasons.append(WaitReason(pending.uid, "forced_decode", f"this step is a {forced_note}, so "
                                      "running requests are not starved"))
        elif refusal is not None and pending.uid == refusal.uid:
            reasons.append(refusal)
            head = pending.uid
        elif head is not None:
            reasons.append(WaitReason(pending.uid, "fcfs", f"behind uid{head}, which did not fit "
                                      "(first come, first served: nobody jumps the queue)"))
    return tuple(reasons)


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
    batch = prepared.batch
    return StepEvent(
        step=step, phase=batch.phase, batch_size=batch.size,
        num_tokens=len(batch.positions) if batch.is_prefill else batch.size, reqs=prepared.req_steps,
        kv_pages_used=prepared.pages_used, kv_pages_total=kv_pages_total, elapsed_s=elapsed_s, tp_size=tp_size,
        note=prepared.note, finished=finished, waiting=prepared.waiting, kv_pages_cached=prepared.pages_cached,
        arrived=prepared.arrived, waits=prepared.waits, kv=prepared.kv, evicted_pages=prepared.evicted_pages,
        radix=radix, started_s=started_s)
