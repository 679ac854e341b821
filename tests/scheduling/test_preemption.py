"""Estimate admission and preemption: a pool too small for every request's whole life gives the same tokens as a
large pool and as transformers, whoever is preempted, however often, under any cache, loop or chunking."""

from __future__ import annotations

import pytest

from core import LLM, SamplingParams
from core.llm.arrivals import Arrival
from core.scheduler.estimate import MIN_RATIO
from tests.support.checks import assert_pages_accounted, greedy

# four requests that each fit the small pool alone (rejection: prompt + max_tokens - 1 <= 40 pages of 1 token),
# but not together: the newest are preempted as the four grow
PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]
SMALL = {"num_pages": 40, "max_running_req": 4}


def run(llm: LLM, prompts, params, bold: bool = False) -> tuple[list[dict], list, dict[int, list[int]]]:
    """The results, the step events and every token each request's replies carried, in order. ``bold``: admission
    kept at its least ratio, so a preempted request comes back as soon as its pages are there, to be preempted
    again."""
    events, streamed = [], {}

    def on_step(event) -> None:
        events.append(event)
        if bold:
            llm.scheduler.estimate.ratio = MIN_RATIO

    llm.add_step_callback(on_step)
    llm.add_reply_callback(lambda r: r.token is not None and streamed.setdefault(r.uid, []).append(r.token))
    return llm.generate(prompts, params), events, streamed


def preempted(events) -> list[int]:
    return [uid for e in events for uid in e.preempted]


@pytest.mark.parametrize("cache,overlap", [("radix", False), ("naive", False), ("radix", True)])
def test_a_small_pool_preempts_and_gives_the_tokens_of_a_large_one(model_dirs, cache, overlap):
    path = model_dirs["llama"]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    llm = LLM(path, cache=cache, overlap=overlap, **SMALL)
    out, events, streamed = run(llm, PROMPTS, params, bold=True)
    victims = preempted(events)
    assert victims[:3] == [3, 2, 1]  # the newest first; the oldest request is never the one preempted
    assert max(victims.count(uid) for uid in victims) >= 2  # one request preempted twice
    for i, prompt in enumerate(PROMPTS):
        assert out[i]["token_ids"] == greedy(path, prompt, 24) == streamed[i]  # nothing lost, nothing resent
    assert llm.stats()["preemptions"] == len(victims)
    assert_pages_accounted(llm)
    requeued = [w for e in events for w in e.waits if w.kind == "preempted"]
    assert requeued and {w.uid for w in requeued} <= set(victims)
    freed = [e.preempted_pages for e in events if e.preempted]
    assert all(pages > 0 for pages in freed)


def test_seeded_sampling_draws_the_same_tokens_when_recomputed(model_dirs):
    path = model_dirs["llama"]
    params = [SamplingParams(max_tokens=24, temperature=0.9, top_k=40, seed=s, ignore_eos=True) for s in range(4)]
    expected = [r["token_ids"] for r in LLM(path, max_running_req=4).generate(PROMPTS, params)]
    out, events, _ = run(LLM(path, **SMALL), PROMPTS, params)
    assert preempted(events)
    assert [r["token_ids"] for r in out] == expected


def test_reserve_admission_never_preempts(model_dirs):
    path = model_dirs["llama"]
    llm = LLM(path, admission="reserve", **SMALL)
    out, events, _ = run(llm, PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))
    assert not preempted(events) and max(e.batch_size for e in events) == 1  # 26 of 40 pages each: one at a time
    assert [r["token_ids"] for r in out] == [greedy(path, p, 24) for p in PROMPTS]


def test_abort_of_a_preempted_request(model_dirs):
    path = model_dirs["llama"]
    llm = LLM(path, **SMALL)
    aborted: list[int] = []

    def abort_the_first_victim(event):
        if event.preempted and not aborted:
            aborted.append(event.preempted[0])
            assert llm.abort(event.preempted[0])

    llm.add_step_callback(abort_the_first_victim)
    out, _, streamed = run(llm, PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))
    (uid,) = aborted
    assert out[uid]["finish_reason"] == "abort"
    assert out[uid]["token_ids"] == streamed[uid] == greedy(path, PROMPTS[uid], len(streamed[uid]))
    assert all(out[i]["token_ids"] == greedy(path, PROMPTS[i], 24) for i in range(4) if i != uid)
    assert_pages_accounted(llm)


def test_a_request_preempted_part_way_through_its_chunked_prompt(model_dirs):
    """uid2 comes at step 16 with a prompt cut into chunks of 8, admitted on the least ratio while uid0 and uid1
    still decode; they outgrow their estimates, the pool runs out between uid2's chunks and uid2, the newest, gives
    its chunks' pages back and starts its prompt again later."""
    path = model_dirs["llama"]
    prompts = [[1, 2, 3], [4, 5, 6, 7], list(range(20, 84))]
    max_tokens = (26, 26, 2)
    llm = LLM(path, num_pages=106, max_running_req=3, max_extend_tokens=8)
    llm.scheduler.estimate.ratio = MIN_RATIO
    events = []
    llm.add_step_callback(events.append)
    out = llm.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens],
                       arrivals=[None, None, Arrival(step=16)])
    chunks = [e.step for e in events for r in e.reqs if r.uid == 2 and e.phase == "prefill"]
    first_victim = next(e.step for e in events if 2 in e.preempted)
    assert min(chunks) < first_victim < max(chunks)
    assert [r["token_ids"] for r in out] == [greedy(path, p, n) for p, n in zip(prompts, max_tokens)]
    assert_pages_accounted(llm)


def test_a_request_that_cannot_fit_even_alone_is_refused_at_admission(model_dirs):
    llm = LLM(model_dirs["llama"], **SMALL)
    (out,) = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=40, ignore_eos=True))
    assert out["finish_reason"] == "error" and "KV pages" in out["error"]
