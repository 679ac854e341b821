"""Property: under random load over several generate calls, every request finishes exactly as it would alone,
first tokens come in arrival order, and no row or page is ever leaked.

Each example sends a few waves of requests (separate generate calls) with random lengths, max_tokens, EOS or
ignore_eos, through an engine with random page size, pool, row count and prefill budget. One token id is
declared EOS so that both kinds of finish happen; the expected output is the single-request greedy run cut
at its first EOS.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.checks import assert_pages_accounted, greedy
from core import LLM, SamplingParams

EOS = 83  # the id the seeded random Qwen3 emits most often (in about a third of short greedy runs)
MAX_TOKENS = 8
PROMPT_LEN = 20
_llms: dict[tuple, LLM] = {}


def engine(path: str, page_size: int, rows: int, pool_factor: int, budget: int) -> LLM:
    key = (path, page_size, rows, pool_factor, budget)
    if key not in _llms:
        longest = -(-(PROMPT_LEN + MAX_TOKENS) // page_size)
        llm = LLM(path, page_size=page_size, max_running_req=rows, num_pages=max(rows, longest) * pool_factor,
                  max_extend_tokens=budget)
        llm.eos_token_ids = frozenset({EOS})
        _llms[key] = llm
    return _llms[key]


def expected(path: str, prompt: list[int], params: SamplingParams) -> tuple[list[int], str]:
    tokens = greedy(path, prompt, params.max_tokens)
    if not params.ignore_eos and EOS in tokens:
        return tokens[: tokens.index(EOS)], "stop"
    return tokens, "length"


requests = st.tuples(st.lists(st.integers(0, 255), min_size=1, max_size=PROMPT_LEN),
                     st.integers(1, MAX_TOKENS), st.booleans())


@settings(max_examples=25, deadline=None)
@given(page_size=st.sampled_from([1, 2, 16]), rows=st.sampled_from([1, 2, 5]), pool_factor=st.sampled_from([1, 4]),
       budget=st.sampled_from([5, 64]), waves=st.lists(st.lists(requests, min_size=1, max_size=6), min_size=1,
                                                          max_size=3))
def test_random_waves_finish_correctly_in_order_without_leaks(model_dirs, page_size, rows, pool_factor, budget,
                                                              waves):
    path = model_dirs["qwen3"]
    llm = engine(path, page_size, rows, pool_factor, budget)
    for wave in waves:
        first_token_step: dict[int, int] = {}
        step = [0]

        def on_step(event, step=step):
            step[0] = event.step

        def on_reply(reply, seen=first_token_step, step=step):
            if reply.token is not None:
                seen.setdefault(reply.uid, step[0])

        llm.scheduler.step_callbacks[:] = [on_step]
        llm._routes.callbacks[:] = [on_reply]
        prompts = [p for p, _, _ in wave]
        params = [SamplingParams(max_tokens=n, ignore_eos=ignore) for _, n, ignore in wave]
        out = llm.generate(prompts, params)
        for prompt, sp, result in zip(prompts, params, out):
            tokens, reason = expected(path, prompt, sp)
            assert (result["token_ids"], result["finish_reason"]) == (tokens, reason)
        order = [first_token_step[uid] for uid in sorted(first_token_step)]
        assert order == sorted(order), "a later request got its first token before an earlier one"
        assert_pages_accounted(llm)
