"""Preemption: when a decode step cannot get a KV page for every request in it, some requests give theirs back.

Under ``estimate`` admission (core/scheduler/estimate.py) the running requests are promised less than their whole
lives, so the pool can run out. Then, before the step is prepared:

* the victim is the running request that arrived last (the newest): the oldest requests go on and finish first,
  and a request is never preempted for one that arrived after it while that one still runs;
* its computed KV goes into the prefix cache (the radix cache keeps its whole pages until they are needed, so
  recomputing it later is mostly a cache hit) and the rest of its pages and its row are freed;
* it is queued again at the head, with its prompt and the tokens it generated: its prefill later computes both
  and it samples its next token at the same position with the same seed, so its tokens are those it would have
  had (greedy or seeded); the tokens it generated were sent once and are not sent again, its reply stream pauses;
* victims are taken until every request left in the step gets its page; the oldest running request is never
  preempted (admission refuses a request that could never fit alone, so it always can grow).

Under overlap scheduling a step short of pages first waits for the step in flight: the requests that finish in
it and the pages its release fence holds may be enough. If not, the victim is preempted with nothing in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from core.arith import pages_for
from core.request import Batch, Req
from core.scheduler.cache import CacheManager, OutOfPagesError
from core.scheduler.decode import DecodeManager
from core.scheduler.estimate import PageEstimate
from core.scheduler.prefill import PendingReq, PrefillManager
from core.scheduler.table import TableManager


def pages_needed(reqs: list[Req], page_size: int) -> int:
    """New pages the requests need to hold KV for positions [0, device_len)."""
    return sum(max(0, pages_for(r.device_len, page_size) - len(r.pages)) for r in reqs)


@dataclass
class Preempter:
    cache: CacheManager
    table: TableManager
    decode: DecodeManager
    prefill: PrefillManager
    estimate: PageEstimate
    running: Callable[[], set[Req]]  # every request holding a row: decoding, or part way through its prompt
    preempted: list[int] = field(default_factory=list)  # uids preempted since the last step was reported
    freed_pages: int = 0  # pages they gave back (to the free list or to the prefix cache) meanwhile
    total: int = 0  # preemptions so far

    def make_room(self, batch: Batch, in_flight: bool) -> Batch | None:
        """The decode ``batch`` less its requests preempted so that the rest get their pages; None to wait for
        the step in flight first."""
        page_size = self.estimate.page_size
        preempted = False
        if self.cache.free_pages >= len(batch.reqs):  # a decode step takes at most one new page a request
            self.estimate.decay()
            return batch
        while (short := pages_needed(batch.reqs, page_size) - self.cache.available_pages) > 0:
            if in_flight:  # requests finishing in it and the release fence may free enough: wait for it
                batch.reqs = []
                break
            running = self.running()
            if len(running) <= 1:
                raise OutOfPagesError(f"a lone request needs {short} KV pages more than the pool has")
            victim = max(running, key=lambda r: r.arrival)
            self.preempt(victim)
            preempted = True
            batch.reqs = [r for r in batch.reqs if r is not victim]
        if preempted:
            self.estimate.after_preemption(self.running())
        elif batch.reqs:
            self.estimate.decay()
        return batch if batch.reqs else None

    def preempt(self, req: Req) -> None:
        """Give back the request's row and the pages the prefix cache does not keep; queue it again at the head."""
        chunked = self.prefill.find(req.uid)
        self.decode.remove(req)
        req.done = True  # a step in flight may still hold it: its token there is dropped
        held = len(req.pages)
        self.cache.cache_req(req, finished=True)  # its KV, for the positions the host has tokens for, is kept
        self.table.free(req.table_idx)
        self.preempted.append(req.uid)
        self.freed_pages += held
        self.total += 1
        if chunked is not None:  # part way through its prompt: it is still queued, at the head
            chunked.admitted = None
            chunked.preemptions += 1
            return
        self.prefill.add_first(PendingReq(req.uid, list(req.input_ids), req.params, req.sample_seed, req.matcher,
                                          arrival=req.arrival, output_ids=list(req.output_ids),
                                          preemptions=req.preemptions + 1))

    def take_report(self) -> tuple[tuple[int, ...], int]:
        """The uids preempted and the pages they gave back since the last call."""
        report = (tuple(self.preempted), self.freed_pages)
        self.preempted, self.freed_pages = [], 0
        return report
