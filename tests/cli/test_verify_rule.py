"""The verify rule: exact match, or at the first difference a near-tie (engine token in the reference top-5)."""

from __future__ import annotations

import pytest

from core import LLM, SamplingParams
from core.bench.reference import HFReference, Reference, RefStep, compare
from tests.support.models import EOS_ID
from tests.support.reference import hf_greedy

EOS = {EOS_ID}


def step(token: int, *others: int) -> RefStep:
    """A reference position choosing ``token``, with ``others`` next in its top-5 at falling logprobs."""
    ranked = (token,) + others
    return RefStep(token, tuple((t, -0.1 - i) for i, t in enumerate(ranked)))


REF = Reference((step(5, 6, 7), step(8, 9), step(10, 11)), stopped=False)


def test_identical_tokens_match():
    verdict = compare([5, 8, 10], "length", REF, EOS)
    assert verdict.status == "match" and verdict.exact and verdict.position is None and verdict.compared == 3


def test_difference_within_top5_is_a_near_tie_at_the_first_differing_position():
    verdict = compare([5, 9, 3], "length", REF, EOS)
    assert (verdict.status, verdict.position, verdict.engine_token, verdict.reference_token) == ("near-tie", 1, 9, 8)
    assert verdict.rank == 1 and verdict.logprob_gap == pytest.approx(1.0)
    assert not verdict.exact


def test_difference_outside_top5_is_a_mismatch():
    verdict = compare([5, 8, 99], "length", REF, EOS)
    assert (verdict.status, verdict.position, verdict.rank) == ("mismatch", 2, None)


def test_stopping_at_eos_matches_a_reference_that_stopped_there():
    ref = Reference((step(5), step(EOS_ID, 4)), stopped=True)
    assert ref.token_ids == [5]
    assert compare([5], "stop", ref, EOS).exact


def test_engine_stopping_where_the_reference_went_on_is_judged_by_the_eos_rank():
    ref = Reference((step(5), step(4, EOS_ID)), stopped=False)
    verdict = compare([5], "stop", ref, EOS)
    assert (verdict.status, verdict.position, verdict.engine_token, verdict.reference_token) == ("near-tie", 1, None, 4)
    verdict = compare([5], "stop", Reference((step(5), step(4, 3)), stopped=False), EOS)
    assert verdict.status == "mismatch"


def test_engine_going_on_where_the_reference_stopped_is_a_difference():
    ref = Reference((step(5), step(EOS_ID, 4)), stopped=True)
    verdict = compare([5, 4], "length", ref, EOS)
    assert (verdict.status, verdict.position, verdict.engine_token, verdict.reference_token) == \
        ("near-tie", 1, 4, EOS_ID)


def test_hf_reference_is_transformers_greedy_with_its_top5(model_dirs):
    reference = HFReference(model_dirs["qwen3"])
    ids = [3, 17, 200, 41]
    ref = reference.greedy(ids, 6, ignore_eos=True)
    assert [s.token for s in ref.steps] == hf_greedy(model_dirs["qwen3"], ids, 6)
    for s in ref.steps:
        assert s.top[0][0] == s.token and len(s.top) == 5
        assert [lp for _, lp in s.top] == sorted((lp for _, lp in s.top), reverse=True)


def test_engine_output_matches_the_reference(model_dirs):
    llm = LLM(model_dirs["llama"], max_running_req=4)
    prompts = [[5, 6, 7], [100, 3], [9] * 12]
    results = llm.generate(prompts, SamplingParams(max_tokens=5))
    reference = HFReference(llm.model_dir)
    for prompt, result in zip(prompts, results):
        ref = reference.greedy(prompt, 5, llm.eos_token_ids)
        assert compare(result["token_ids"], result["finish_reason"], ref, llm.eos_token_ids).exact
