"""Property: whatever the prompts, page size, pool size and prefill budget, every output equals the prompt's
greedy decoding alone, and after every generate call each KV page is free or cached, exactly once.

Prompts are glued together from a few shared pieces so that prefixes repeat (cache hits, in-batch sharing,
identical prompts); small pools force waiting and eviction; small budgets force chunking. One LLM is built per
configuration and kept across examples, so later examples also run against a warm, partly evicted cache.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.checks import assert_pages_accounted, greedy
from core import LLM, SamplingParams
from core.arith import pages_for

_rng = random.Random(0)
PIECES = [[_rng.randrange(256) for _ in range(n)] for n in (24, 9, 13, 3)]
MAX_TOKENS = 6
MAX_KV_LEN = 3 * max(map(len, PIECES)) + 2 + MAX_TOKENS - 1  # three pieces, a tail of two, then decoding

_llms: dict[tuple, LLM] = {}


@st.composite
def engine_configs(draw) -> tuple:
    page_size = draw(st.sampled_from([1, 4, 16]))
    rows = draw(st.sampled_from([1, 3]))
    # "tight": the longest possible request only just fits, so requests queue and the cache gets evicted
    pool = max(rows, pages_for(MAX_KV_LEN, page_size)) * draw(st.sampled_from([1, 3]))
    budget = draw(st.sampled_from([8, 21, 512]))
    cache = draw(st.sampled_from(["radix", "radix", "naive"]))
    return cache, page_size, rows, pool, budget


@st.composite
def workloads(draw) -> tuple[list[list[int]], list[int]]:
    n = draw(st.integers(1, 5))
    pieces = st.lists(st.sampled_from(range(len(PIECES))), min_size=1, max_size=3)
    tails = st.lists(st.integers(0, 3), max_size=2)
    prompts = [[t for i in draw(pieces) for t in PIECES[i]] + draw(tails) for _ in range(n)]
    return prompts, draw(st.lists(st.integers(1, MAX_TOKENS), min_size=n, max_size=n))


def engine(path: str, config: tuple) -> LLM:
    if (path, config) not in _llms:
        cache, page_size, rows, pool, budget = config
        _llms[path, config] = LLM(path, cache=cache, page_size=page_size, max_running_req=rows, num_pages=pool,
                                  max_extend_tokens=budget)
    return _llms[path, config]


@settings(max_examples=30, deadline=None)
@given(config=engine_configs(), workload=workloads())
def test_outputs_equal_single_request_greedy_and_no_page_is_lost(model_dirs, config, workload):
    path = model_dirs["llama"]
    prompts, max_tokens = workload
    llm = engine(path, config)
    out = llm.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens])
    assert [r["finish_reason"] for r in out] == ["length"] * len(prompts)
    assert [r["token_ids"] for r in out] == [greedy(path, p, n) for p, n in zip(prompts, max_tokens)]
    assert_pages_accounted(llm)
