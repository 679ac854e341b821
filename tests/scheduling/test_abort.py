"""Abort and interruption: the request's row and pages come back, its result says 'abort', the others go on."""

from __future__ import annotations

import pytest

from tests.support.checks import assert_pages_accounted, greedy
from core import LLM, SamplingParams

PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]


@pytest.fixture
def llm(model_dirs) -> LLM:
    return LLM(model_dirs["llama"], max_running_req=2, page_size=2)


def test_abort_a_running_request_from_a_callback(llm, model_dirs):
    def on_reply(reply):
        if reply.uid == 1 and reply.token is not None and len(produced.setdefault(1, [])) == 1:
            assert llm.abort(1)
        if reply.token is not None:
            produced.setdefault(reply.uid, []).append(reply.token)

    produced: dict[int, list[int]] = {}
    llm.add_reply_callback(on_reply)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    out = llm.generate(PROMPTS, params)
    assert out[1]["finish_reason"] == "abort"
    assert out[1]["token_ids"] == greedy(model_dirs["llama"], PROMPTS[1], 2)  # what it produced before the abort
    for i in (0, 2, 3):
        assert out[i]["finish_reason"] == "length"
        assert out[i]["token_ids"] == greedy(model_dirs["llama"], PROMPTS[i], 6)
    assert_pages_accounted(llm)


def test_abort_a_queued_request_before_it_starts(llm):
    aborted = []

    def on_step(event):
        if event.step == 0:
            aborted.append(llm.abort(3))  # uid 3 is still waiting: only two rows

    llm.add_step_callback(on_step)
    out = llm.generate(PROMPTS, SamplingParams(max_tokens=3, ignore_eos=True))
    assert aborted == [True]
    assert out[3] == {**out[3], "finish_reason": "abort", "token_ids": []}
    assert [r["finish_reason"] for r in out[:3]] == ["length"] * 3
    assert_pages_accounted(llm)


def test_abort_of_an_unknown_or_finished_request_is_a_no_op(llm):
    llm.generate(PROMPTS[:1], SamplingParams(max_tokens=2))
    assert llm.abort(0) is False
    assert llm.abort(12345) is False


def test_interrupt_mid_run_frees_everything_and_the_llm_stays_usable(llm, model_dirs):
    def interrupt(event):
        if event.step == 2:
            raise KeyboardInterrupt

    llm.add_step_callback(interrupt)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, SamplingParams(max_tokens=6, ignore_eos=True))
    assert_pages_accounted(llm)
    llm.scheduler.step_callbacks.clear()
    out = llm.generate(PROMPTS, SamplingParams(max_tokens=4, ignore_eos=True))
    assert [r["token_ids"] for r in out] == [greedy(model_dirs["llama"], p, 4) for p in PROMPTS]
