"""PrefillManager: the FCFS queue of requests waiting to prefill, and admission into a prefill batch.

Admission (PrefillAdder) takes requests from the head of the queue until the first that does not fit: no free
table row, too few KV pages for what it is expected to need (core/scheduler/estimate.py: its whole life under
``reserve``, its prompt and a share of max_tokens under ``estimate``; less what the prefix cache holds, after what
the running requests are expected to take), or no token budget left this step. Stopping there, rather than
skipping the misfit, keeps the queue fair. A prompt longer than the remaining budget is cut into chunks: the
request keeps its row and pages and stays at the head of the queue until its last chunk is done; a chunk whose
pages are not there (under ``estimate``, running requests may have taken them) waits.

A preempted request (core/scheduler/preempt.py) is queued again at the head with the tokens it generated: its
prefill computes its prompt and those tokens (mostly found in the prefix cache), and it goes on from there.

A request under a constraint whose grammar is still being compiled (core/constrain/grammars.py: on a worker
thread, a second or two for the first one's tokenizer tables) cannot be admitted until its matcher is ready, and
does not block the queue meanwhile: those behind it are admitted past it, as in SGLang's grammar queue. Holding
them would make one client's schema everyone's latency, for a wait that has nothing to do with their pages or
rows; the waiting request keeps its place, so once ready it goes before everyone who came after it.

With a prefix cache, a request that shares a long uncached prefix with one already in this batch waits one
step, by which time that prefix is cached, rather than compute it a second time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from core.arith import pages_for
from core.events import WaitReason
from core.request import Batch, Req, SamplingParams
from core.scheduler.cache import CacheManager
from core.scheduler.decode import DecodeManager
from core.scheduler.estimate import PageEstimate
from core.scheduler.table import TableManager

Queued = Literal["nothing", "some", "burst"]

# shared tokens (beyond what is cached) worth waiting a step for, rather than computing them twice in one batch
IN_BATCH_SHARED_TOKENS = 32


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


@dataclass(eq=False)
class PendingReq:
    uid: int
    input_ids: list[int]  # what its prefill computes: the prompt, then any tokens generated before a preemption
    params: SamplingParams
    sample_seed: int
    matcher: Any = None  # under a constraint, its grammar's matcher (core/constrain/), handed to the running request
    arrival: int = 0  # the order requests arrived in: the newest running request is the one preempted
    output_ids: list[int] = field(default_factory=list)  # generated before it was preempted: kept, never resent
    preemptions: int = 0
    admitted: Req | None = None  # the running request, once its first chunk was admitted

    @property
    def awaits_grammar(self) -> bool:
        """Under a constraint whose matcher is not ready yet: it stays queued, passed by those behind it."""
        return self.matcher is None and self.params.constraint is not None

    @property
    def max_device_len(self) -> int:
        return len(self.input_ids) - len(self.output_ids) + self.params.max_tokens

    @property
    def max_kv_len(self) -> int:
        """Positions that will ever hold KV (the last sampled token is never fed back)."""
        return self.max_device_len - 1


@dataclass
class PrefillAdder:
    token_budget: int
    reserved_pages: int
    cache: CacheManager
    table: TableManager
    estimate: PageEstimate
    token_pool_writes: list[tuple[int, int, list[int]]] = field(default_factory=list)
    admitted_prompt_tokens: int = 0  # prompts of requests admitted this step, and the part of them found cached
    admitted_cached_tokens: int = 0
    batch: list[tuple[int, list[int]]] = field(default_factory=list)  # (uid, prompt) of each request so far
    refusal: WaitReason | None = None  # why the last request tried was not admitted

    def try_add(self, pending: PendingReq) -> Req | None:
        if self.token_budget <= 0:
            self.refusal = WaitReason(pending.uid, "token_budget", "this step's prefill token budget is used up "
                                      "(long prompts are cut into chunks over several steps)")
            return None
        req = pending.admitted or self._admit(pending)
        if req is None:
            return None
        extend = min(len(pending.input_ids) - req.cached_len, self.token_budget)
        if pending.admitted is req and not self._chunk_fits(req, req.cached_len + extend):
            return None
        req.device_len = req.cached_len + extend
        self.token_budget -= extend
        self.token_pool_writes.append((req.table_idx, req.cached_len, pending.input_ids[req.cached_len:req.device_len]))
        self.batch.append((pending.uid, pending.input_ids))
        return req

    def _admit(self, pending: PendingReq) -> Req | None:
        """Give the request a row and its cached prefix, if a row and enough pages for its whole life are free."""
        if self.table.available == 0:
            self.refusal = WaitReason(pending.uid, "rows", f"no free table row: all {self.table.total_rows} "
                                      "rows hold running requests")
            return None
        match = self.cache.match(pending.input_ids)
        sharer = self._shares_with_batch(pending.input_ids, match.cached_len)
        if sharer is not None:
            self.refusal = WaitReason(pending.uid, "shared_prefix", f"waits one step for uid{sharer} in this "
                                      "batch to cache the prompt prefix they share")
            return None
        lifetime_pages = self.estimate.pages_ahead(len(pending.input_ids), pending.max_device_len, len(match.pages))
        # matched pages that nobody else holds are counted as evictable; locking them takes them out of that pool
        available = self.cache.available_pages - self.cache.prefix_cache.evictable_in(match.handle)
        if lifetime_pages + self.reserved_pages > available:
            free, evictable = self.cache.free_pages, available - self.cache.free_pages
            promised = f", {self.reserved_pages} promised to running requests" if self.reserved_pages else ""
            self.refusal = WaitReason(pending.uid, "kv_pages", f"KV: needs {lifetime_pages} pages, {free} free, "
                                      f"{evictable} evictable{promised}", lifetime_pages, free, evictable)
            return None
        req = Req(uid=pending.uid, input_ids=list(pending.input_ids), prompt_len=len(pending.input_ids),
                  table_idx=self.table.allocate(), cached_len=match.cached_len, device_len=match.cached_len,
                  max_device_len=pending.max_device_len, params=pending.params, sample_seed=pending.sample_seed,
                  matcher=pending.matcher, output_ids=list(pending.output_ids), arrival=pending.arrival,
                  preemptions=pending.preemptions)
        self.cache.adopt(req, match)
        self.reserved_pages += lifetime_pages
        if not pending.preemptions:  # the hit rate counts prompts, not recomputed requests
            self.admitted_prompt_tokens += req.prompt_len
            self.admitted_cached_tokens += req.cached_len
        pending.admitted = req
        return req

    def _chunk_fits(self, req: Req, device_len: int) -> bool:
        """Whether the pages for a chunked prompt's next chunk are there (always, under ``reserve``)."""
        needed = pages_for(device_len, self.estimate.page_size) - len(req.pages)
        free = self.cache.free_pages
        if needed <= self.cache.available_pages:
            return True
        self.refusal = WaitReason(req.uid, "kv_pages", f"KV: its next prompt chunk needs {needed} pages, {free} "
                                  f"free, {self.cache.available_pages - free} evictable", needed, free,
                                  self.cache.available_pages - free)
        return False

    def _shares_with_batch(self, prompt: list[int], cached_len: int) -> int | None:
        """The request already in this batch that, once cached, would let this one reuse many more tokens."""
        if not self.cache.reuses_prefixes:
            return None
        for uid, other in self.batch:
            # what the cache could match once ``other`` is in it: whole pages, never the last prompt token
            page = self.estimate.page_size
            shared = common_prefix_len(prompt[:-1], other) // page * page
            if shared - cached_len >= IN_BATCH_SHARED_TOKENS:
                return uid
        return None


class PrefillManager:
    def __init__(self, cache: CacheManager, table: TableManager, decode: DecodeManager,
                 estimate: PageEstimate) -> None:
        self.cache = cache
        self.table = table
        self.decode = decode
        self.estimate = estimate
        self.pending: list[PendingReq] = []
        self.refusal: WaitReason | None = None  # why the head of the queue was not admitted in the last step
        # cumulative over every admitted request: the prefix cache's hit rate is cached / prompt
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0

    def add(self, pending: PendingReq) -> None:
        self.pending.append(pending)

    def add_first(self, pending: PendingReq) -> None:
        """Queue a preempted request ahead of every other: it was running before any of them was admitted."""
        self.pending.insert(0, pending)

    @property
    def runnable(self) -> bool:
        """Whether a queued request could be admitted now (one waiting for its grammar cannot)."""
        return any(not p.awaits_grammar for p in self.pending)

    def queued(self, burst_tokens: int) -> Queued:
        """What waits to prefill: a burst (requests not yet started holding at least ``burst_tokens`` prompt tokens,
        core/scheduler/policy.py, counting what the prefix cache may hold: a hit is only known once a request is
        matched; the rest of a prompt part-way through its chunks is not a burst), some, or nothing admissible."""
        waiting, ready = 0, False
        for p in self.pending:
            if not p.awaits_grammar:
                ready = True
                waiting += len(p.input_ids) if p.admitted is None else 0
                if waiting >= burst_tokens:
                    return "burst"
        return "some" if ready else "nothing"

    def reserved_pages(self) -> int:
        """Pages the decoding requests and the chunked ones part-way through their prompt are expected to take."""
        ahead = self.estimate.pages_ahead
        chunked = sum(ahead(len(p.input_ids), p.max_device_len, len(p.admitted.pages))
                      for p in self.pending if p.admitted is not None)
        return chunked + sum(ahead(r.device_len, r.max_device_len, len(r.pages)) for r in self.decode.running)

    def schedule_next_batch(self, token_budget: int) -> tuple[Batch, list[tuple[int, int, list[int]]]] | None:
        self.refusal = None
        if not self.pending:
            return None
        # A chunked request at the head was counted when it was admitted, but what it does not hold yet stays
        # counted, so nobody admitted behind it can take those pages.
        adder = PrefillAdder(token_budget, self.reserved_pages(), self.cache, self.table, self.estimate)
        reqs: list[Req] = []
        ready = [p for p in self.pending if not p.awaits_grammar]
        for pending in ready:
            req = adder.try_add(pending)
            if req is None:
                break
            reqs.append(req)
        self.refusal = adder.refusal
        if not reqs:
            return None
        self.prompt_tokens += adder.admitted_prompt_tokens
        self.cached_prompt_tokens += adder.admitted_cached_tokens
        admitted = ready[: len(reqs)]
        still_chunked = [p for p in admitted if p.admitted is not None and p.admitted.is_chunked]
        left = set(admitted)
        self.pending = still_chunked + [p for p in self.pending if p not in left]
        return Batch(reqs=reqs, phase="prefill"), adder.token_pool_writes

    def find(self, uid: int) -> PendingReq | None:
        return next((p for p in self.pending if p.uid == uid), None)

    def remove(self, pending: PendingReq) -> None:
        self.pending.remove(pending)
