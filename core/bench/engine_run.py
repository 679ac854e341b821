"""The engine's side of the benchmark: the workload through ``LLM.generate``, timed per token.

Every request is submitted at once, so time to first token includes queueing behind earlier prefills, as it
would for a burst of requests arriving together.
"""

from __future__ import annotations

import time
from typing import Callable

from core.bench.report import Latency, Percentiles, ProgressFn, RunResult
from core.bench.workload import Workload
from core.llm import LLM
from core.request import SamplingParams
from core.scheduler.scheduler import Reply


class _TokenClock:
    """Records, per uid, when the first and the last token arrived and how many came."""

    def __init__(self, on_token: Callable[[], None]) -> None:
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.count: dict[int, int] = {}
        self.on_token = on_token
        self.active = True

    def __call__(self, reply: Reply) -> None:
        if reply.token is None or not self.active:
            return
        now = time.perf_counter()
        self.first.setdefault(reply.uid, now)
        self.last[reply.uid] = now
        self.count[reply.uid] = self.count.get(reply.uid, 0) + 1
        self.on_token()


def sampling_params(workload: Workload) -> list[SamplingParams]:
    temperature = workload.spec.temperature
    return [SamplingParams(max_tokens=r.max_tokens, temperature=temperature, ignore_eos=True,
                           seed=workload.seed * 100003 + i if temperature > 0 else None)
            for i, r in enumerate(workload.requests)]


def warm_up(llm: LLM) -> None:
    """Run a tiny batch so one-off costs (allocator growth, first kernel calls) stay out of the timing."""
    llm.generate([[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11]], SamplingParams(max_tokens=4, ignore_eos=True))


def run_engine(llm: LLM, workload: Workload, progress: ProgressFn) -> tuple[RunResult, Latency]:
    total = workload.output_tokens
    produced = 0

    def on_token() -> None:
        nonlocal produced
        produced += 1
        if produced % 16 == 0 or produced == total:
            progress("minisgl", produced, total)

    clock = _TokenClock(on_token)
    llm.add_reply_callback(clock)
    params = sampling_params(workload)
    start = time.perf_counter()
    outputs = llm.generate([r.prompt_ids for r in workload.requests], params)
    wall = time.perf_counter() - start
    clock.active = False
    failed = [o for o in outputs if o["finish_reason"] == "error"]
    if failed:
        raise RuntimeError(f"{len(failed)} benchmark requests failed: {failed[0]['error']}")
    tokens = sum(len(o["token_ids"]) for o in outputs)
    ttft = [clock.first[uid] - start for uid in clock.first]
    tpot = [(clock.last[uid] - clock.first[uid]) / (clock.count[uid] - 1) for uid in clock.first
            if clock.count[uid] > 1]
    return RunResult("minisgl", wall, tokens, len(workload.requests)), Latency(Percentiles.of(ttft), Percentiles.of(tpot))
