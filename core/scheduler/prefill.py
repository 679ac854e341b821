"""PrefillManager: the FCFS queue of requests waiting to prefill, and admission into a prefill batch.

Admission (PrefillAdder) takes requests from the head of the queue until the first one that does not fit:
no free table row, not enough KV pages for its whole life (prompt plus max_tokens, after what the prefix
cache already holds and after the pages promised to the requests already decoding), or no token budget left
this step. Stopping at the first misfit rather than skipping it keeps the queue fair: nothing is jumped over.
A prompt longer than the remaining budget is cut into chunks; the chunked request keeps its row and pages and
stays at the head of the queue until its last chunk is done.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.request import Batch, Req, SamplingParams
from core.scheduler.cache import CacheManager
from core.scheduler.decode import DecodeManager, pages_for
from core.scheduler.table import TableManager


@dataclass(eq=False)
class PendingReq:
    uid: int
    input_ids: list[int]
    params: SamplingParams
    sample_seed: int
    started: Req | None = None  # set once its first chunk was admitted

    @property
    def max_device_len(self) -> int:
        return len(self.input_ids) + self.params.max_tokens


@dataclass
class PrefillAdder:
    token_budget: int
    reserved_pages: int
    cache: CacheManager
    table: TableManager
    page_size: int
    token_pool_writes: list[tuple[int, int, list[int]]] = field(default_factory=list)

    def try_add(self, pending: PendingReq) -> Req | None:
        if self.token_budget <= 0:
            return None
        req = pending.started or self._admit(pending)
        if req is None:
            return None
        extend = min(len(pending.input_ids) - req.cached_len, self.token_budget)
        req.device_len = req.cached_len + extend
        self.token_budget -= extend
        self.token_pool_writes.append((req.table_idx, req.cached_len, pending.input_ids[req.cached_len:req.device_len]))
        return req

    def _admit(self, pending: PendingReq) -> Req | None:
        """Give the request a row and its cached prefix, if a row and enough pages for its whole life are free."""
        if self.table.available == 0:
            return None
        match = self.cache.match(pending.input_ids)
        lifetime_pages = pages_for(pending.max_device_len, self.page_size) - len(match.pages)
        # matched pages that nobody else holds are counted as evictable; locking them takes them out of that pool
        if lifetime_pages + self.reserved_pages > self.cache.available_pages - self._evictable_in(match):
            return None
        req = Req(uid=pending.uid, input_ids=list(pending.input_ids), prompt_len=len(pending.input_ids),
                  table_idx=self.table.allocate(), cached_len=match.cached_len, device_len=match.cached_len,
                  max_device_len=pending.max_device_len, params=pending.params, sample_seed=pending.sample_seed)
        self.cache.adopt(req, match)
        self.reserved_pages += lifetime_pages
        pending.started = req
        return req

    def _evictable_in(self, match) -> int:
        before = self.cache.available_pages
        self.cache.prefix_cache.lock(match.handle)
        after = self.cache.available_pages
        self.cache.prefix_cache.unlock(match.handle)
        return before - after


class PrefillManager:
    def __init__(self, cache: CacheManager, table: TableManager, decode: DecodeManager, page_size: int) -> None:
        self.cache = cache
        self.table = table
        self.decode = decode
        self.page_size = page_size
        self.pending: list[PendingReq] = []

    def add(self, pending: PendingReq) -> None:
        self.pending.append(pending)

    @property
    def runnable(self) -> bool:
        return bool(self.pending)

    def reserved_pages(self) -> int:
        """Pages promised to decoding requests and to chunked requests part-way through their prompt."""
        chunked = sum(pages_for(p.max_device_len, self.page_size) - len(p.started.pages)
                      for p in self.pending if p.started is not None)
        return self.decode.reserved_pages + chunked

    def schedule_next_batch(self, token_budget: int) -> tuple[Batch, list[tuple[int, int, list[int]]]] | None:
        if not self.pending:
            return None
        adder = PrefillAdder(token_budget, self.reserved_pages(), self.cache, self.table, self.page_size)
        # a started (chunked) request's own remaining pages were counted as reserved: it must not pay twice
        reqs: list[Req] = []
        for pending in self.pending:
            if pending.started is not None:
                adder.reserved_pages -= pages_for(pending.max_device_len, self.page_size) - len(pending.started.pages)
            req = adder.try_add(pending)
            if req is None:
                break
            reqs.append(req)
        if not reqs:
            return None
        still_chunked = [p for p in self.pending[: len(reqs)] if p.started is not None and p.started.is_chunked]
        self.pending = still_chunked + self.pending[len(reqs):]
        return Batch(reqs=reqs, phase="prefill"), adder.token_pool_writes

    def find(self, uid: int) -> PendingReq | None:
        return next((p for p in self.pending if p.uid == uid), None)

    def remove(self, pending: PendingReq) -> None:
        self.pending.remove(pending)
