"""Comparing two engines' tokens under the near-tie rule (bf16 on a GPU).

Batching can flip a greedy near-tie in bf16, so two runs are compared as vLLM's tests do: at the first
position where the tokens differ, each side's token must be among the other side's five most likely tokens
for that same prefix (a tie with the fifth counts), and the comparison stops there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core import LLM, SamplingParams


class LogitsRecorder:
    """Stands in for an engine's sampler and keeps the logits of the last step it sampled."""

    def __init__(self, sampler) -> None:
        self.inner = sampler
        self.last: torch.Tensor | None = None

    def prepare(self, batch):
        return self.inner.prepare(batch)

    def sample(self, logits: torch.Tensor, args) -> torch.Tensor:
        self.last = logits.detach().float().clone()
        return self.inner.sample(logits, args)


def next_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """Every logit of the next token after ``ids`` (one prefill of the whole prefix), float32 on the host. The
    request asks for log-probabilities so that every logit is computed: a greedy request's LM head may screen
    the row and leave only its largest logit exact (core/kernels/gpu_screened_head.py)."""
    recorder = LogitsRecorder(llm.engine.sampler)
    llm.engine.sampler = recorder
    try:
        llm.generate([ids], SamplingParams(max_tokens=1, ignore_eos=True, logprobs=0))
    finally:
        llm.engine.sampler = recorder.inner
    return recorder.last[0].cpu()


def in_top(logits: torch.Tensor, token: int, k: int) -> bool:
    """Whether ``token`` is among the k most likely, a tie with the k-th included: bf16 logits tie often, and
    topk's order among equal values is its own (an fp8 engine's token once sat at exactly the 5th logit, 7.156,
    and fell outside topk's five)."""
    return logits[token].item() >= logits.topk(k).values[-1].item()


def _margins(logits: torch.Tensor, own: int, other: int, k: int) -> str:
    """How far apart the two tokens are in one engine's logits, against its k-th largest: what a mismatch's
    report needs to tell a tie just outside the top k from a real difference."""
    kth = logits.topk(k).values[-1].item()
    return f"{logits[own].item():.3f} / {logits[other].item():.3f} (k-th {kth:.3f})"


@dataclass
class Verdict:
    exact: int = 0
    near_tie: int = 0
    mismatch: int = 0
    details: list[str] | None = None

    @property
    def ok(self) -> bool:
        return self.mismatch == 0

    def __str__(self) -> str:
        return f"{self.exact} exact, {self.near_tie} near-tie, {self.mismatch} mismatch"


def near_tie_compare(llm_a: LLM, llm_b: LLM, prompts: list[list[int]], outs_a: list[list[int]],
                     outs_b: list[list[int]], k: int = 5) -> Verdict:
    verdict = Verdict(details=[])
    for i, (prompt, a, b) in enumerate(zip(prompts, outs_a, outs_b)):
        if a == b:
            verdict.exact += 1
            continue
        pos = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        if pos >= min(len(a), len(b)):  # one is a prefix of the other: lengths differ, a real bug
            verdict.mismatch += 1
            verdict.details.append(f"prompt {i}: lengths {len(a)} vs {len(b)}")
            continue
        prefix = prompt + a[:pos]
        logits_a, logits_b = next_logits(llm_a, prefix), next_logits(llm_b, prefix)
        top_a, top_b = logits_a.topk(k).indices.tolist(), logits_b.topk(k).indices.tolist()
        if in_top(logits_b, a[pos], k) and in_top(logits_a, b[pos], k):
            verdict.near_tie += 1
        else:
            verdict.mismatch += 1
            verdict.details.append(f"prompt {i} pos {pos}: {a[pos]} vs {b[pos]}; top {top_a} / {top_b}; logits of "
                                   f"the two: {_margins(logits_a, a[pos], b[pos], k)} / "
                                   f"{_margins(logits_b, b[pos], a[pos], k)}")
    return verdict
