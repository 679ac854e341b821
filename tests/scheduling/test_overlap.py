"""Overlap scheduling, proven on the CPU: the overlap loop runs the same bookkeeping synchronously, so it must
give the plain loop's tokens, finish reasons and final accounting, through EOS stops (a request that stops while
its next step is already launched), the radix cache, chunked prefill, seeded sampling and aborts.
"""

from __future__ import annotations

import random

import pytest

from tests.support.checks import assert_pages_accounted
from core import LLM, SamplingParams
from core.config import EngineConfig
from core.scheduler.fence import ReleaseFence
from core.engine.plan import overlap_enabled

MODEL = "llama"


def workload(seed: int = 3) -> tuple[list[list[int]], list[SamplingParams]]:
    """Shared prefixes (cache hits), long prompts (chunks under a small budget), greedy and seeded rows."""
    rng = random.Random(seed)
    system = [rng.randrange(256) for _ in range(37)]
    prompts = [system + [rng.randrange(256) for _ in range(rng.randint(1, 20))] for _ in range(6)]
    prompts += [[rng.randrange(256) for _ in range(rng.randint(1, 60))] for _ in range(6)]
    params = [SamplingParams(max_tokens=rng.randint(1, 14), temperature=0.0 if i % 3 else 0.8, seed=i)
              for i in range(len(prompts))]
    return prompts, params


def engine(path: str, overlap: bool, **kwargs) -> LLM:
    options = dict(cache="radix", page_size=4, max_running_req=4, num_pages=96, max_extend_tokens=48)
    options.update(kwargs)
    llm = LLM(path, overlap=overlap, **options)
    assert llm.overlap is overlap
    return llm


def frequent_token(outputs: list[dict]) -> int:
    """A token that the outputs produce often, mid-sequence: as EOS it stops many requests early."""
    counts: dict[int, int] = {}
    for out in outputs:
        for token in out["token_ids"][1:-1]:
            counts[token] = counts.get(token, 0) + 1
    return max(counts, key=counts.get)


def record_replies(llm: LLM) -> dict[int, list]:
    """Every reply the scheduler sends, before the LLM files it away (it ignores a request's late replies)."""
    replies: dict[int, list] = {}
    send = llm.scheduler.send_result

    def record(batch: list) -> None:
        for reply in batch:
            replies.setdefault(reply.uid, []).append(reply)
        send(batch)

    llm.scheduler.send_result = record
    return replies


def summary(outputs: list[dict]) -> list[tuple]:
    return [(o["token_ids"], o["finish_reason"]) for o in outputs]


@pytest.mark.parametrize("page_size", [1, 4])
def test_overlap_gives_the_plain_loops_tokens_stops_and_final_stats(model_dirs, page_size):
    path = model_dirs[MODEL]
    prompts, params = workload()
    # whole-life reservation: under estimate admission the overlap loop, which sees each result a step later, may
    # preempt in other steps than the plain loop (the same tokens all the same: tests/scheduling/test_preemption.py)
    plain, overlapped = (engine(path, overlap, page_size=page_size, admission="reserve") for overlap in (False, True))
    events = {plain: [], overlapped: []}
    for llm in (plain, overlapped):
        llm.add_step_callback(events[llm].append)
    first = [llm.generate(prompts, params) for llm in (plain, overlapped)]  # EOS never met: all run to length
    assert summary(first[1]) == summary(first[0])
    eos = frequent_token(first[0])
    for llm in (plain, overlapped):
        llm.scheduler.eos_token_ids = frozenset({eos})
    runs = {}
    for name, llm in (("plain", plain), ("overlap", overlapped)):
        results = [llm.generate(prompts, params) for _ in range(2)]  # the second round hits a warm cache
        runs[name] = (results, events[llm], llm.stats())
        assert_pages_accounted(llm)
    (plain_out, plain_events, plain_stats), (over_out, over_events, over_stats) = runs["plain"], runs["overlap"]
    assert [summary(r) for r in over_out] == [summary(r) for r in plain_out]
    reasons = [o["finish_reason"] for r in plain_out for o in r]
    assert "stop" in reasons and "length" in reasons  # both ways of finishing are exercised
    assert over_stats == plain_stats
    prefills = [s.uid for e in over_events if e.phase == "prefill" for s in e.reqs]
    assert any(prefills.count(uid) > 1 for uid in prefills)  # some prompt was cut into chunks
    assert sum(e.phase == "decode" for e in over_events) >= sum(e.phase == "decode" for e in plain_events)


def test_a_request_that_stops_on_eos_is_answered_once_though_its_next_step_was_launched(model_dirs):
    path = model_dirs[MODEL]
    prompts, _ = workload(seed=5)
    params = SamplingParams(max_tokens=12)
    llm = engine(path, True)
    llm.scheduler.eos_token_ids = frozenset({frequent_token(engine(path, False).generate(prompts, params))})
    replies = record_replies(llm)
    events: list = []
    llm.add_step_callback(events.append)
    out = llm.generate(prompts, params)
    stopped = [i for i, o in enumerate(out) if o["finish_reason"] == "stop"]
    assert stopped
    for uid, got in replies.items():
        assert [r.finished for r in got] == [False] * (len(got) - 1) + [True]  # one final reply, last
    # the stopped requests were launched once more than they produced: that step's token was dropped
    launched = {uid: sum(s.uid == uid for e in events for s in e.reqs if e.phase == "decode") for uid in replies}
    assert any(launched[uid] == len(replies[uid]) for uid in stopped)
    assert_pages_accounted(llm)


@pytest.mark.parametrize("overlap", [False, True])
def test_abort_from_a_reply_callback_frees_everything_and_answers_once(model_dirs, overlap):
    path = model_dirs[MODEL]
    prompts, params = workload(seed=7)
    llm = engine(path, overlap, max_extend_tokens=16)  # small budget: some aborts land mid-prompt
    replies = record_replies(llm)
    aborted: set[int] = set()

    def on_reply(reply) -> None:
        if reply.finished:  # each finish aborts a request further down: decoding, waiting, or mid-prompt
            victim = (reply.uid + 3) % len(prompts)
            if victim not in aborted and llm.abort(victim):
                aborted.add(victim)

    llm.add_reply_callback(on_reply)
    out = llm.generate(prompts, params)
    assert aborted
    assert all(out[uid]["finish_reason"] == "abort" for uid in aborted)
    for uid, got in replies.items():  # nothing after the one final reply, an abort's included
        assert [r.finished for r in got] == [False] * (len(got) - 1) + [True]
    assert sorted(replies) == list(range(len(prompts)))
    assert_pages_accounted(llm)
    again = llm.generate(prompts[:3], params[:3])  # the engine goes on working
    assert [o["finish_reason"] for o in again] == ["length"] * 3


def test_release_fence_holds_frees_until_every_earlier_batch_completed():
    fence, free = ReleaseFence(), [1]
    fence.free(free, [2])  # nothing in flight: at once
    first = fence.launch()
    fence.free(free, [3])
    second = fence.launch()
    fence.free(free, [4, 5])
    assert free == [1, 2] and fence.held == 3
    fence.complete(first)
    assert free == [1, 2, 3]
    fence.complete(second)
    assert free == [1, 2, 3, 4, 5] and not fence.in_flight


def test_overlap_is_on_for_cuda_off_on_cpu_unless_configured(monkeypatch):
    import torch

    monkeypatch.delenv("MINISGL_DISABLE_OVERLAP_SCHEDULING", raising=False)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert overlap_enabled(EngineConfig(), cuda) and not overlap_enabled(EngineConfig(), cpu)
    assert overlap_enabled(EngineConfig(overlap=True), cpu)
    assert not overlap_enabled(EngineConfig(overlap=False), cuda)
    monkeypatch.setenv("MINISGL_DISABLE_OVERLAP_SCHEDULING", "1")
    assert not overlap_enabled(EngineConfig(overlap=True), cuda)
