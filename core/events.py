"""Step events: one plain record per scheduled batch, for whoever wants to watch the scheduler work.

The trace view, the benchmarks and the tests all consume these instead of reaching into the scheduler.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

from core.request import Phase


@dataclass(frozen=True)
class ReqStep:
    """One request's share of a step: how many tokens it computed and how many it reused from cache."""

    uid: int
    extend_len: int
    cached_len: int


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

    def to_dict(self) -> dict:
        return asdict(self)


StepCallback = Callable[[StepEvent], None]
