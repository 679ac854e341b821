"""The engine's side of the benchmark: the workload through ``LLM.generate``, timed per token.

Every request is submitted at once, so time to first token includes queueing behind earlier prefills, as it
would for a burst of requests arriving together. After it, one request runs alone for the batch-1 decode
latency, the figure a single interactive user sees.
"""

from __future__ import annotations

import time
from dataclasses import replace
from itertools import chain, islice
from typing import Callable

from core.bench.report import Latency, Percentiles, ProgressFn, RunResult
from core.bench.workload import BenchRequest, Workload
from core.llm import LLM
from core.request import SamplingParams
from core.scheduler.reply import Reply


class _TokenClock:
    """Records, per uid, when each token arrived, while active (the LLM keeps its callbacks, so a finished
    measurement switches its clock off)."""

    def __init__(self, on_token: Callable[[], None] = lambda: None) -> None:
        self.times: dict[int, list[float]] = {}
        self.on_token = on_token
        self.active = True

    def __call__(self, reply: Reply) -> None:
        if reply.token is None or not self.active:
            return
        self.times.setdefault(reply.uid, []).append(time.perf_counter())
        self.on_token()


def sampling_params(workload: Workload) -> list[SamplingParams]:
    temperature = workload.spec.temperature
    return [SamplingParams(max_tokens=r.max_tokens, temperature=temperature, ignore_eos=True,
                           seed=workload.seed * 100003 + i if temperature > 0 else None)
            for i, r in enumerate(workload.requests)]


WARM_UP_TOKENS = 8  # tokens per request in the warm-up run
BATCH1_PROMPT_LEN = 128


def warm_up(llm: LLM, workload: Workload) -> None:
    """Run the workload once, cut short to a few tokens per request, so one-off costs stay out of the timing:
    allocator growth, every prefill shape, the first replay of each CUDA graph, the compiled sampler.

    The prefix cache is emptied afterwards (on every rank), or the timed run would find every prompt cached.
    """
    params = [replace(p, max_tokens=min(p.max_tokens, WARM_UP_TOKENS)) for p in sampling_params(workload)]
    llm.generate([r.prompt_ids for r in workload.requests], params)
    llm.reset_prefix_cache()


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
    preempted = llm.stats()["preemptions"]
    start = time.perf_counter()
    outputs = llm.generate([r.prompt_ids for r in workload.requests], params)
    wall = time.perf_counter() - start
    clock.active = False
    failed = [o for o in outputs if o["finish_reason"] == "error"]
    if failed:
        raise RuntimeError(f"{len(failed)} benchmark requests failed: {failed[0]['error']}")
    tokens = sum(len(o["token_ids"]) for o in outputs)
    ttft = [times[0] - start for times in clock.times.values()]
    tpot = [(times[-1] - times[0]) / (len(times) - 1) for times in clock.times.values() if len(times) > 1]
    result = RunResult("minisgl", wall, tokens, len(workload.requests), preemptions=llm.stats()["preemptions"] - preempted)
    return result, Latency(Percentiles.of(ttft), Percentiles.of(tpot))


def batch1_request(workload: Workload, max_seq_len: int) -> BenchRequest:
    """The batch-1 request: 128 prompt ids taken from the workload's own prompts (so from its id range) and
    the spec's ``batch1_tokens``, both cut to fit ``max_seq_len``."""
    ids = list(islice(chain.from_iterable(r.prompt_ids for r in workload.requests), BATCH1_PROMPT_LEN))
    prompt_len = max(1, min(len(ids), max_seq_len // 2))
    return BenchRequest(ids[:prompt_len], max(1, min(workload.spec.batch1_tokens, max_seq_len - prompt_len)))


def run_batch1(llm: LLM, request: BenchRequest) -> float | None:
    """One greedy request alone; the median time between consecutive tokens in ms (None with one token).

    The median leaves out the prefill before the first token and any one-off step, so it is the decode step's
    latency at batch size 1.
    """
    clock = _TokenClock()
    llm.add_reply_callback(clock)
    try:
        [out] = llm.generate([request.prompt_ids], SamplingParams(max_tokens=request.max_tokens, temperature=0,
                                                                  ignore_eos=True))
    finally:
        clock.active = False
    if out["finish_reason"] == "error":
        raise RuntimeError(f"the batch-1 request failed: {out['error']}")
    times = clock.times.get(out["uid"], [])
    gaps = [b - a for a, b in zip(times, times[1:])]
    return Percentiles.of(gaps).p50 * 1e3 if gaps else None
