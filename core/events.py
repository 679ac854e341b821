"""Step events: one plain record per scheduled batch, so the trace view, the benchmarks and the tests watch the
scheduler work without reaching into it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Literal

from core.request import Phase


@dataclass(frozen=True)
class ReqStep:
    """One request's share of a step: how many tokens it computed and how many it reused from cache."""

    uid: int
    extend_len: int
    cached_len: int
    constrained: bool = False  # it samples under a grammar (structured output: core/constrain/)


WaitKind = Literal["rows", "kv_pages", "token_budget", "forced_decode", "fcfs", "shared_prefix", "preempted",
                   "grammar"]


@dataclass(frozen=True)
class WaitReason:
    """Why a queued request was not admitted in a step, as a kind for programs and words for a learner.
    ``rows``: every table row is taken; ``kv_pages``: the pages for its whole life are more than free plus
    evictable (after those promised to running requests); ``token_budget``: this step's prefill tokens are used
    up; ``forced_decode``: the step is a decode forced so running requests are not starved; ``fcfs``: an earlier
    request did not fit, and nobody jumps the queue; ``shared_prefix``: it waits one step for a request in this
    batch to cache the prefix they share; ``preempted``: it was preempted and waits to be recomputed;
    ``grammar``: its constraint's grammar is being compiled (on a worker thread), and others go past it."""

    uid: int
    kind: WaitKind
    text: str
    pages_needed: int = 0  # for kv_pages: what it needs, and what there was
    pages_free: int = 0
    pages_evictable: int = 0


@dataclass(frozen=True)
class KVUsage:
    """The KV pool after the step was scheduled. Every page is in exactly one part: a running request's own
    pages, the prefix cache's pages (shared by running requests or kept for reuse), or free."""

    by_request: tuple[tuple[int, int], ...]  # (uid, pages it holds that the prefix cache does not own)
    cached: int
    free: int
    total: int


@dataclass(frozen=True)
class RadixNodeView:
    """One node of the radix tree: a span of tokens (whole pages) below its parent."""

    node_id: int
    parent_id: int | None
    num_tokens: int
    first_tokens: tuple[int, ...]  # the span's first few token ids, to recognise it
    pages: int
    lock_count: int  # running requests reading it: a locked node cannot be evicted
    holders: tuple[int, ...]  # uids of running requests whose matched prefix runs through it


@dataclass(frozen=True)
class StepEvent:
    step: int
    phase: Phase
    batch_size: int
    num_tokens: int
    reqs: tuple[ReqStep, ...]
    kv_pages_used: int  # not free: held by requests or by the prefix cache
    kv_pages_total: int
    elapsed_s: float
    tp_size: int = 1
    # why this batch was chosen when it was not the default policy (e.g. decode forced after many prefills)
    note: str = ""
    # uids that finished in this step, and the waiting queue length when the batch was formed
    finished: tuple[int, ...] = field(default=())
    waiting: int = 0
    kv_pages_cached: int = 0  # of the used pages, those the prefix cache owns (shared, or kept for reuse)
    arrived: tuple[int, ...] = field(default=())  # uids that entered the queue since the previous step
    waits: tuple[WaitReason, ...] = field(default=())  # every request still queued after this step was formed
    kv: KVUsage | None = None
    evicted_pages: int = 0  # cached pages taken back in this step to make room
    radix: tuple[RadixNodeView, ...] | None = None  # the tree after the step, when a watcher asked for it
    started_s: float = 0.0  # when the step was scheduled, in seconds since the scheduler was built
    mask_fill_s: float = 0.0  # host time filling the token masks of the rows under a grammar (0: none)
    mask_wait_s: float = 0.0  # what the loop waited for them: under overlap the fill runs beside other host work
    preempted: tuple[int, ...] = field(default=())  # uids preempted to make room for this step, queued again
    preempted_pages: int = 0  # the KV pages they gave back (freed, or kept by the prefix cache)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StepEvent":
        """The event from ``to_dict``'s plain form (lists where it had tuples), as it crosses a process boundary."""
        d = dict(d)
        d["reqs"] = tuple(ReqStep(*r) if isinstance(r, (list, tuple)) else ReqStep(**r) for r in d["reqs"])
        d["finished"], d["arrived"] = tuple(d["finished"]), tuple(d["arrived"])
        d["preempted"] = tuple(d.get("preempted", ()))
        d["waits"] = tuple(WaitReason(**w) for w in d["waits"])
        if d.get("kv") is not None:
            kv = d["kv"]
            d["kv"] = KVUsage(tuple(tuple(p) for p in kv["by_request"]), kv["cached"], kv["free"], kv["total"])
        if d.get("radix") is not None:
            d["radix"] = tuple(RadixNodeView(**{**n, "first_tokens": tuple(n["first_tokens"]),
                                                "holders": tuple(n["holders"])}) for n in d["radix"])
        return cls(**d)


StepCallback = Callable[[StepEvent], None]
