"""How many KV pages a request is expected to take before it finishes: what admission counts, for the request it
admits and for every request already running.

``reserve`` counts a request's whole life, prompt plus ``max_tokens``: a request admitted never waits for a page,
and the pool is mostly promised to tokens that are never generated (a chat reply stops at EOS long before the
context does).

``estimate`` counts its prompt and a share of the tokens it may still generate: ``ratio`` of them, at most
``ESTIMATE_CAP`` tokens' worth. The ratio starts at ``INITIAL_RATIO`` and falls by ``RATIO_DECAY`` at every decode
step, down to ``MIN_RATIO``, so admission grows bolder while the pool suffices. When it does not, the scheduler
preempts (core/scheduler/preempt.py) and the ratio goes up, by ``RATIO_STEP_UP`` at least and to the share of their
budgets the requests still running have used so far if that is more: admission turns careful again (a request
just preempted is not readmitted at once to be preempted again), then slowly bolder.
Pages are given as requests grow, whatever the rule (core/scheduler/cache.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from core.arith import pages_for
from core.request import Req

INITIAL_RATIO = 0.5
MIN_RATIO = 0.1
RATIO_DECAY = 0.002  # per decode step: from the initial ratio to the least in 200 steps
ESTIMATE_CAP = 1024  # new tokens counted for one request at most (max_tokens is often the whole context)
RATIO_STEP_UP = 0.1  # the least a preemption raises the ratio by


@dataclass
class PageEstimate:
    rule: str  # "estimate" or "reserve" (EngineConfig.admission)
    page_size: int
    ratio: float = INITIAL_RATIO

    @property
    def reserves(self) -> bool:
        return self.rule == "reserve"

    def final_kv_len(self, tokens: int, max_device_len: int) -> int:
        """The KV positions a request that holds ``tokens`` tokens (its prompt so far and what it generated) is
        counted for: its whole life under ``reserve`` (the last sampled token is never fed back: no KV)."""
        if self.reserves:
            return max_device_len - 1
        left = max_device_len - tokens
        return min(max_device_len - 1, tokens + math.ceil(self.ratio * min(left, ESTIMATE_CAP)))

    def pages_ahead(self, tokens: int, max_device_len: int, held_pages: int) -> int:
        """Pages a request is expected to take beyond the ``held_pages`` it holds."""
        return max(0, pages_for(self.final_kv_len(tokens, max_device_len), self.page_size) - held_pages)

    def decay(self) -> None:
        """A decode step went by and every request got its page: count a little less for the tokens ahead."""
        if not self.reserves:
            self.ratio = max(MIN_RATIO, self.ratio - RATIO_DECAY)

    def after_preemption(self, running: Iterable[Req]) -> None:
        """The pool ran out: count more for the tokens ahead, at least what the running requests used so far."""
        generated = budget = 0
        for req in running:
            generated += len(req.output_ids)
            budget += min(req.params.max_tokens, ESTIMATE_CAP)
        used = generated / budget if budget else 0.0
        self.ratio = min(1.0, max(self.ratio + RATIO_STEP_UP, used))
