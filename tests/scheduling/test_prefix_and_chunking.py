"""Radix prefix cache, chunked prefill and admission under memory pressure, seen through the whole engine.

Every output is checked against transformers' greedy decoding of the prompt alone, and after every run every KV
page must be either free or owned by the cache, exactly once.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from core.words import plural

from tests.support.checks import assert_pages_accounted, greedy
from core import LLM, SamplingParams

MODEL = "llama"


def params(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


def record_steps(llm: LLM) -> list:
    events: list = []
    llm.add_step_callback(events.append)
    return events


def shared_prefix_prompts(seed: int = 0) -> list[list[int]]:
    """A 40-token "system prompt" with different questions, plus one unrelated prompt and one exact repeat."""
    rng = random.Random(seed)
    system = [rng.randrange(256) for _ in range(40)]
    questions = [[rng.randrange(256) for _ in range(k)] for k in (3, 9, 17)]
    other = [rng.randrange(256) for _ in range(21)]
    return [system + questions[0], system + questions[1], other, system + questions[2], system + questions[0]]


@pytest.mark.parametrize("page_size", [1, 16])
def test_naive_radix_and_chunked_prefill_all_equal_transformers(model_dirs, page_size):
    path = model_dirs[MODEL]
    prompts = shared_prefix_prompts()
    max_tokens = [5, 3, 6, 4, 5]
    expected = [greedy(path, p, n) for p, n in zip(prompts, max_tokens)]
    for cache, budget in [("naive", 8192), ("radix", 8192), ("naive", 8), ("radix", 8), ("radix", 13)]:
        llm = LLM(path, cache=cache, page_size=page_size, max_running_req=2, max_extend_tokens=budget)
        events = record_steps(llm)
        for _ in range(2 if cache == "radix" else 1):  # the second round runs against a warm cache
            out = llm.generate(prompts, [params(n) for n in max_tokens])
            assert [r["token_ids"] for r in out] == expected, (cache, budget)
            assert_pages_accounted(llm)
        assert max(e.num_tokens for e in events if e.phase == "prefill") <= budget
        hits = [s.cached_len for e in events if e.phase == "prefill" for s in e.reqs if s.cached_len > 0]
        if cache == "radix":
            assert hits, "the shared system prompt was never reused"
        assert (llm.stats()["hit_rate"] > 0) == (cache == "radix")


def test_second_generate_reuses_the_shared_prefix(model_dirs):
    path = model_dirs[MODEL]
    system = list(range(100, 148))
    first_prompts = [system + [1, 2, 3], system + [4, 5]]
    second_prompts = [system + [6, 7, 8, 9], system + [10]]
    llm = LLM(path, page_size=16, max_running_req=4)
    assert llm.config.cache == "radix"  # the default
    events = record_steps(llm)
    llm.generate(first_prompts, params(4))
    first_prefill = sum(e.num_tokens for e in events if e.phase == "prefill")
    del events[:]
    out = llm.generate(second_prompts, params(4))

    prefill_steps = [s for e in events if e.phase == "prefill" for s in e.reqs]
    assert {s.cached_len for s in prefill_steps} == {48}  # three whole pages of the system prompt
    assert sum(e.num_tokens for e in events if e.phase == "prefill") == 4 + 1
    assert first_prefill == len(first_prompts[0]) + 2  # the second prompt waited a step and reused the first's
    assert [r["token_ids"] for r in out] == [greedy(path, p, 4) for p in second_prompts]
    stats = llm.stats()
    assert stats["cached_prompt_tokens"] == 3 * 48
    assert stats["hit_rate"] == pytest.approx(3 * 48 / (51 + 50 + 52 + 49))


def test_a_request_arriving_while_the_first_decodes_already_hits(model_dirs):
    """The prompt's KV is cached right after its prefill, not only when the request finishes."""
    path = model_dirs[MODEL]
    first, second = list(range(30, 50)), list(range(30, 50)) + [7, 8]
    llm = LLM(path, page_size=4, max_extend_tokens=len(first))  # the budget holds one prompt per step
    events = record_steps(llm)
    out = llm.generate([first, second], params(6))
    assert [e.phase for e in events[:2]] == ["prefill", "prefill"]
    assert events[1].reqs[0].uid == 1 and events[1].reqs[0].cached_len == 20  # the first prompt's 5 pages
    assert not events[0].finished and not events[1].finished  # the first one was still decoding
    assert [r["token_ids"] for r in out] == [greedy(path, first, 6), greedy(path, second, 6)]


def test_a_whole_prompt_in_cache_still_computes_its_last_token(model_dirs):
    path = model_dirs[MODEL]
    prompt = list(range(60, 76))  # exactly one page of 16
    llm = LLM(path, page_size=1)
    events = record_steps(llm)
    llm.generate([prompt], params(3))
    del events[:]
    out = llm.generate([prompt], params(3))
    assert events[0].reqs[0].extend_len == 1 and events[0].reqs[0].cached_len == 15
    assert out[0]["token_ids"] == greedy(path, prompt, 3)


def test_chunks_continue_where_the_previous_one_stopped_and_sample_nothing(model_dirs):
    path = model_dirs[MODEL]
    prefix, prompt = list(range(1, 17)), list(range(1, 17)) + list(range(200, 220))
    llm = LLM(path, page_size=16, max_extend_tokens=8)
    llm.generate([prefix + [9]], params(1))  # caches one page of the prefix
    events = record_steps(llm)
    tokens = []
    llm.add_reply_callback(lambda reply: tokens.append(reply.token))
    out = llm.generate([prompt], params(3))
    prefill = [(e.reqs[0].cached_len, e.reqs[0].extend_len) for e in events if e.phase == "prefill"]
    assert prefill == [(16, 8), (24, 8), (32, 4)]  # starts after the matched page, then chunk after chunk
    assert len(tokens) == 3  # no reply (no token) for the first two chunks
    assert out[0]["token_ids"] == greedy(path, prompt, 3)
    assert_pages_accounted(llm)


def test_identical_prompts_in_one_batch_end_up_sharing_pages(model_dirs):
    """Too short to be worth waiting for each other, so all three compute the same pages in one batch."""
    path = model_dirs[MODEL]
    prompt = list(range(40, 58))  # 18 tokens: four whole pages of 4 and two more tokens
    llm = LLM(path, page_size=4, num_pages=32, max_running_req=3)
    events = record_steps(llm)
    out = llm.generate([prompt] * 3, params(4))
    assert events[0].batch_size == 3 and all(s.cached_len == 0 for s in events[0].reqs)
    # after the prefill the copies of the four whole pages were given back: 4 shared + 3 own tail pages
    assert events[0].kv_pages_used == 15 and events[1].kv_pages_used == 7
    assert events[0].kv_pages_cached == 0 and events[1].kv_pages_cached == 4
    assert all(r["token_ids"] == greedy(path, prompt, 4) for r in out)
    assert llm.stats()["cached_pages"] == 5  # 21 tokens of KV at the finish: five whole pages
    assert_pages_accounted(llm)


@pytest.mark.parametrize("cache", ["naive", "radix"])
def test_prompts_sharing_a_long_prefix_wait_a_step_to_reuse_it(model_dirs, cache):
    path = model_dirs[MODEL]
    system = list(range(100, 140))
    prompts = [system + [1], list(range(1, 30)), system + [2, 3], system + [4]]
    llm = LLM(path, cache=cache, page_size=4)
    events = record_steps(llm)
    out = llm.generate(prompts, params(3))
    prefill = [[(s.uid, s.cached_len) for s in e.reqs] for e in events if e.phase == "prefill"]
    if cache == "radix":  # FCFS: the unrelated prompt behind the first sharer waits too
        assert prefill == [[(0, 0), (1, 0)], [(2, 40), (3, 40)]] or prefill == [[(0, 0)], [(1, 0), (2, 40), (3, 40)]]
    else:
        assert prefill == [[(0, 0), (1, 0), (2, 0), (3, 0)]]
    assert [r["token_ids"] for r in out] == [greedy(path, p, 3) for p in prompts]


@pytest.mark.parametrize("cache", ["naive", "radix"])
def test_chunked_request_keeps_its_pages_reserved_for_those_behind_it(model_dirs, cache):
    """A short request admitted with the last chunk of a long one must not take the long one's decode pages."""
    path = model_dirs[MODEL]
    long, short = list(range(1, 13)), [40, 41, 42]
    llm = LLM(path, cache=cache, num_pages=19, max_running_req=2, max_extend_tokens=8)
    out = llm.generate([long, short], [params(4), params(5)])  # needs 15 + 7 KV pages at most: 19 cannot hold both
    assert [r["token_ids"] for r in out] == [greedy(path, long, 4), greedy(path, short, 5)]
    assert_pages_accounted(llm)


def test_a_pool_smaller_than_the_working_set_evicts_and_completes(model_dirs):
    path = model_dirs[MODEL]
    rng = random.Random(5)
    prompts = [[rng.randrange(256) for _ in range(rng.randint(20, 40))] for _ in range(8)]
    prompts += [p[:15] + [1, 2] for p in prompts[:3]]  # some hits on what is still cached
    llm = LLM(path, page_size=4, num_pages=14, max_running_req=3)  # 11 pages for the longest request
    events = record_steps(llm)
    out = llm.generate(prompts, params(5))
    assert [r["finish_reason"] for r in out] == ["length"] * len(prompts)
    assert [r["token_ids"] for r in out] == [greedy(path, p, 5) for p in prompts]
    assert llm.stats()["evicted_pages"] > 0
    assert max(e.kv_pages_used for e in events) <= 14
    assert_pages_accounted(llm)


def test_requests_that_can_never_fit_get_an_error_at_once(model_dirs):
    path = model_dirs[MODEL]
    llm = LLM(path, page_size=4, num_pages=8, max_running_req=2, max_seq_len=128)
    events = record_steps(llm)
    fits = list(range(1, 27))  # 26 + 7 tokens: 32 of them ever hold KV, exactly the 8 pages
    out = llm.generate([list(range(1, 40)), fits, list(range(1, 100))], [params(8), params(7), params(40)])
    assert [r["finish_reason"] for r in out] == ["error", "length", "error"]
    assert "needs 12 KV pages but the pool has only 8" in out[0]["error"]
    assert "exceeds the context of 128 tokens" in out[2]["error"]
    assert out[1]["token_ids"] == greedy(path, fits, 7)
    assert {s.uid for e in events for s in e.reqs} == {1}  # the rejected ones never took a step
    assert_pages_accounted(llm)


def test_a_burst_is_prefilled_back_to_back_then_a_long_prompt_takes_turns_with_decoding(model_dirs):
    path = model_dirs[MODEL]
    streak, chunk = 2, 8
    llm = LLM(path, max_extend_tokens=chunk, max_prefill_streak=streak, max_running_req=8)
    events = record_steps(llm)
    rng = random.Random(1)
    long_prompts = [[rng.randrange(256) for _ in range(30)] for _ in range(4)]  # 4 chunks each
    prompts = [[5, 6, 7]] + long_prompts
    out = llm.generate(prompts, [params(12)] + [params(2)] * 4)
    assert [r["token_ids"] for r in out] == [greedy(path, p, n) for p, n in zip(prompts, [12, 2, 2, 2, 2])]

    # uid0 decodes from step 1; while requests not yet started hold a full chunk (a burst), prefill goes on past
    # the streak, saying so, until uid4, the last, is admitted (step 11)
    phases = "".join(e.phase[0] for e in events)
    kept = [e for e in events if e.note.startswith("prefill kept on")]
    assert [e.step for e in kept] == list(range(streak + 1, 12)) and phases.startswith("p" * 12 + "d")
    assert kept[0].note == f"prefill kept on after {plural(streak, 'prefill step')}: a burst of new prompts waits"
    assert all(e.num_tokens == chunk for e in kept)
    assert 4 in {r.uid for r in events[11].reqs} and all(4 not in {r.uid for r in e.reqs} for e in events[:11])
    # the rest of uid4's prompt is not a burst: its chunks take turns with decoding, at most `streak` in a row
    after = phases[12:phases.rindex("p") + 1]
    assert "p" in after and "p" * (streak + 1) not in after
    forced = [e for e in events if e.note.startswith("decode forced")]
    assert [e.step for e in forced] == [12, 15]
    assert forced[1].note == f"decode forced after {plural(streak, 'prefill step')}"
    assert all(e.phase == "decode" and e.waiting > 0 for e in forced)  # prefill waited: the decode was forced


def test_a_burst_is_bounded_by_the_free_rows(model_dirs):
    path = model_dirs[MODEL]
    llm = LLM(path, max_extend_tokens=8, max_prefill_streak=1, max_running_req=2)
    events = record_steps(llm)
    prompts = [[5, 6, 7]] + [[1 + i] * 20 for i in range(4)]
    llm.generate(prompts, [params(12)] + [params(2)] * 4)
    # with both rows taken (uid0 decoding, uid1 mid-prompt or decoding) nothing more can be admitted, so the
    # burst behind them cannot hold decoding off: it runs whenever no prefill fits
    phases = "".join(e.phase[0] for e in events)
    assert phases.startswith("pppd")  # uid0 + 5 of uid1, then uid1's last 15 in two chunks, then uid0 decodes


def test_reset_prefix_cache_empties_it_between_and_during_runs(model_dirs):
    path = model_dirs[MODEL]
    prompts = shared_prefix_prompts(seed=2)
    llm = LLM(path, page_size=4, max_running_req=2)
    llm.generate(prompts, params(4))
    assert llm.stats()["cached_pages"] > 0
    assert llm.reset_prefix_cache() > 0
    assert llm.stats()["cached_pages"] == 0 and llm.stats()["free_pages"] == llm.stats()["total_pages"]

    events = record_steps(llm)
    llm.add_step_callback(lambda event: llm.reset_prefix_cache())  # while requests run: locked pages stay
    out = llm.generate(prompts, params(4))
    assert events[0].reqs[0].cached_len == 0
    assert [r["token_ids"] for r in out] == [greedy(path, p, 4) for p in prompts]
    assert llm.stats()["cached_pages"] == 0
    assert_pages_accounted(llm)


SHARED_PREFIX_SAMPLE = Path(__file__).resolve().parents[2] / "sample_prompts" / "shared_prefix.jsonl"


def test_the_shared_prefix_sample_hits_the_cache(model_dirs, smollm2_dir):
    rows = [json.loads(line) for line in SHARED_PREFIX_SAMPLE.read_text().splitlines()]
    assert len(rows) >= 4 and all(isinstance(r["prompt"], str) and r.get("max_tokens", 1) >= 1 for r in rows)
    prompts = [r["prompt"] for r in rows]

    from transformers import AutoTokenizer

    ids = [AutoTokenizer.from_pretrained(smollm2_dir)(p)["input_ids"] for p in prompts]
    shared = min(len(os.path.commonprefix([ids[0], other])) for other in ids[1:])
    assert shared >= 100  # the embedded model's tokens share a long system prompt and few-shot block

    llm = LLM(model_dirs[MODEL])  # byte-level tokens: the same shared prefix, spelled out byte by byte
    events = record_steps(llm)
    llm.generate(prompts, params(2))
    first_prefill = [s for e in events if e.phase == "prefill" for s in e.reqs]
    assert first_prefill[0].cached_len == 0 and all(s.cached_len >= 300 for s in first_prefill[1:])
    assert llm.stats()["hit_rate"] > 0.6
