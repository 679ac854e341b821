"""The near-tie rule that judges the GPU comparisons (core/bench/reference.py, near_tie_compare), checked on the CPU."""

from __future__ import annotations

import torch

from core import LLM, SamplingParams
from core.bench.reference import in_top, near_tie_compare, next_logits


def test_a_tie_with_the_kth_logit_counts_as_in_the_top_k():
    logits = torch.tensor([7.375, 7.281, 7.25, 7.2, 7.156, 7.156, 1.0])
    assert in_top(logits, 5, 5) and in_top(logits, 4, 5)  # topk keeps one of the tied pair; both count
    assert not in_top(logits, 6, 5)
    assert in_top(logits, 0, 1) and not in_top(logits, 1, 1)


def test_the_rule_passes_equal_tokens_and_catches_an_unlikely_one():
    llm = LLM("random:tiny-qwen3", device="cpu")
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7]]
    outs = [o["token_ids"] for o in llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0,
                                                                         ignore_eos=True))]
    assert near_tie_compare(llm, llm, prompts, outs, outs).exact == 2
    # the least likely token after the first prompt's first generated token: far outside any top 5
    logits = next_logits(llm, prompts[0] + outs[0][:1])
    unlikely = int(logits.argmin())
    bad = [outs[0][:1] + [unlikely] + outs[0][2:], outs[1]]
    verdict = near_tie_compare(llm, llm, prompts, outs, bad)
    assert (verdict.exact, verdict.near_tie, verdict.mismatch) == (1, 0, 1)
    assert "prompt 0 pos 1" in verdict.details[0] and "k-th" in verdict.details[0]
