"""The engine's greedy output equals transformers', token by token, for every family and page size."""

from __future__ import annotations

import pytest

from core import LLM, SamplingParams
from tests.support.models import FAMILIES
from tests.support.prompts import varied_prompts
from tests.support.reference import hf_greedy


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("family", [*FAMILIES, "llama3-rope-tied"])
def test_greedy_matches_transformers_with_queueing(model_dirs, family, page_size):
    """More prompts than rows, so some wait in the queue and join as others finish."""
    path = model_dirs[family]
    prompts, max_tokens = varied_prompts(7, seed=hash(family) % 100)
    llm = LLM(path, max_running_req=3, page_size=page_size)
    events = []
    llm.add_step_callback(events.append)
    out = llm.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens])
    for prompt, n, result in zip(prompts, max_tokens, out):
        assert result["token_ids"] == hf_greedy(path, prompt, n)
        assert result["finish_reason"] == "length"
    assert max(e.batch_size for e in events) == 3
    assert sum(1 for e in events if e.phase == "prefill") > 1  # later prompts were admitted as rows freed up


@pytest.mark.parametrize("cache", ["naive", "radix"])
def test_second_generate_gives_same_outputs_and_frees_everything(model_dirs, cache):
    llm = LLM(model_dirs["qwen3"], max_running_req=4, page_size=4, cache=cache)
    prompts, max_tokens = varied_prompts(6, seed=3)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens]
    first = llm.generate(prompts, params)
    stats = llm.stats()
    assert stats["free_rows"] == stats["total_rows"] == 4
    assert stats["free_pages"] + stats["cached_pages"] == stats["total_pages"]
    assert (stats["cached_pages"] > 0) == (cache == "radix")
    second = llm.generate(prompts, params)
    assert [r["token_ids"] for r in first] == [r["token_ids"] for r in second]
    pages = ("free_rows", "total_rows", "free_pages", "cached_pages", "total_pages")
    assert {k: llm.stats()[k] for k in pages} == {k: stats[k] for k in pages}


def test_stops_at_eos_unless_ignored(model_dirs):
    """Find a prompt whose greedy continuation hits some token, declare that token EOS, and check both modes."""
    path = model_dirs["llama"]
    llm = LLM(path, max_running_req=2)
    prompt = [5, 9, 13]
    free_run = hf_greedy(path, prompt, 8)
    llm.eos_token_ids = frozenset({free_run[3]})
    stop_at = free_run.index(free_run[3])
    stopped = llm.generate([prompt], SamplingParams(max_tokens=8))[0]
    assert stopped["finish_reason"] == "stop"
    assert stopped["token_ids"] == free_run[:stop_at]  # the EOS token itself is not part of the output
    ignored = llm.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert ignored["token_ids"] == free_run and ignored["finish_reason"] == "length"
