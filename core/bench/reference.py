"""Checking the engine against transformers: a greedy reference with top-5 logprobs, and the comparison rule.

The reference runs one prompt at a time through the transformers model, in float32 on the CPU, with a plain
loop over its KV cache (what ``generate`` does greedily). A loop rather than ``generate(min_new_tokens=...)``
because that would suppress EOS, while the engine with ``ignore_eos`` merely keeps going after one.

The comparison is the rule ``minisgl verify`` applies: token-exact is a match; otherwise, at the first
differing position, a near-tie when the engine's token is within the reference's top-5 there (the comparison
stops at that position either way). Only the reference's logprobs are known, so this is the one-sided form of the rule:
the two sides share the prefix up to that position, so the reference distribution is the one both tokens
were drawn from.

Two engines against each other (bf16 on a GPU, where batching can flip a greedy near-tie) use the two-sided
form, as vLLM's tests do: at the first position where the tokens differ, each side's token must be among the
other side's five most likely tokens for that same prefix (a tie with the fifth counts), and the comparison
stops there (``near_tie_compare``).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from core.errors import ModelLoadError
from core.request import SamplingParams

if TYPE_CHECKING:
    from core.llm import LLM

TOP_K = 5

Status = Literal["match", "near-tie", "mismatch", "error"]


@dataclass(frozen=True)
class RefStep:
    """One generated position of the reference: the greedy token and the top-5 (token, logprob), best first."""

    token: int
    top: tuple[tuple[int, float], ...]

    def rank_of(self, tokens: Collection[int]) -> int | None:
        """0-based rank of the best-ranked of ``tokens`` within the top-5, or None if none is there."""
        return next((i for i, (t, _) in enumerate(self.top) if t in tokens), None)

    def logprob_of(self, tokens: Collection[int]) -> float | None:
        return next((lp for t, lp in self.top if t in tokens), None)


@dataclass(frozen=True)
class Reference:
    """The reference continuation of one prompt. When ``stopped``, the last step is the EOS it stopped at."""

    steps: tuple[RefStep, ...]
    stopped: bool

    @property
    def token_ids(self) -> list[int]:
        """As the engine reports them: the EOS that ended generation is not part of the output."""
        tokens = [s.token for s in self.steps]
        return tokens[:-1] if self.stopped else tokens


class HFReference:
    """transformers' greedy decoding of a model directory, loaded once and reused for every prompt."""

    def __init__(self, model_dir: str | Path) -> None:
        from transformers import AutoModelForCausalLM

        try:
            self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        except Exception as exc:  # transformers raises many types for an unreadable checkpoint
            raise ModelLoadError(f"transformers cannot load {model_dir} as the reference: {exc}") from exc
        # transformers 5 renamed ``past_key_values`` to ``cache``; use whichever this version's forward takes
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def greedy(self, prompt_ids: list[int], max_tokens: int, eos_token_ids: Collection[int] = (),
               ignore_eos: bool = False) -> Reference:
        """Up to ``max_tokens`` greedy tokens, stopping at an EOS unless ``ignore_eos``."""
        inputs, past, steps = torch.tensor([prompt_ids]), None, []
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # cache argument names move between versions
            for _ in range(max_tokens):
                out = self.model(input_ids=inputs, use_cache=True, **{self._cache_arg: past})
                past = getattr(out, self._cache_arg)
                logprobs = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
                token = int(logprobs.argmax())
                values, ids = logprobs.topk(TOP_K)
                steps.append(RefStep(token, tuple(zip(ids.tolist(), values.tolist()))))
                if not ignore_eos and token in eos_token_ids:
                    return Reference(tuple(steps), stopped=True)
                inputs = torch.tensor([[token]])
        return Reference(tuple(steps), stopped=False)


@dataclass(frozen=True)
class Verdict:
    """How one engine output compares with its reference.

    For a difference, ``position`` is the first differing output index; a token of None stands for "an EOS"
    (the side stopped there); ``rank`` is the engine token's 0-based rank in the reference's top-5 (None if
    outside) and ``logprob_gap`` how much less likely the reference found it than its own choice.
    """

    status: Status
    compared: int = 0  # positions that agree
    position: int | None = None
    engine_token: int | None = None
    reference_token: int | None = None
    rank: int | None = None
    logprob_gap: float | None = None
    error: str | None = None

    @property
    def exact(self) -> bool:
        return self.status == "match"

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "matching_tokens": self.compared, "position": self.position,
                "engine_token": self.engine_token, "reference_token": self.reference_token,
                "engine_rank_in_reference_top5": self.rank, "logprob_gap": self.logprob_gap, "error": self.error}


def compare(engine_ids: list[int], finish_reason: str | None, reference: Reference,
            eos_token_ids: Collection[int]) -> Verdict:
    """Compare one engine result (its token ids and finish reason) with the reference, position by position."""
    engine_seq: list[int | None] = list(engine_ids) + ([None] if finish_reason == "stop" else [])
    ref_seq = [s.token for s in reference.steps]
    for pos in range(max(len(engine_seq), len(ref_seq))):
        mine = engine_seq[pos] if pos < len(engine_seq) else None
        theirs = ref_seq[pos] if pos < len(ref_seq) else None
        if pos < len(engine_seq) and pos < len(ref_seq) and _same(mine, theirs, eos_token_ids):
            continue
        if pos >= len(engine_seq):  # the engine ended early without an EOS (it was given fewer tokens)
            return Verdict("mismatch", compared=pos, position=pos, reference_token=theirs)
        return _difference(pos, mine, theirs, reference, eos_token_ids)
    return Verdict("match", compared=len(ref_seq))


def _same(mine: int | None, theirs: int | None, eos_token_ids: Collection[int]) -> bool:
    if mine is None:  # the engine stopped here: the reference must have produced an EOS too
        return theirs in eos_token_ids
    return mine == theirs


def _difference(pos: int, mine: int | None, theirs: int | None, reference: Reference,
                eos_token_ids: Collection[int]) -> Verdict:
    if pos >= len(reference.steps):  # the engine went on past the reference's end: no logprobs to judge by
        return Verdict("mismatch", compared=pos, position=pos, engine_token=mine, reference_token=None)
    step = reference.steps[pos]
    candidates = set(eos_token_ids) if mine is None else {mine}
    rank = step.rank_of(candidates)
    gap = None
    if rank is not None:
        gap = step.top[0][1] - (step.logprob_of(candidates) or 0.0)
    status: Status = "near-tie" if rank is not None else "mismatch"
    return Verdict(status, compared=pos, position=pos, engine_token=mine, reference_token=theirs, rank=rank,
                   logprob_gap=gap)


class LogitsRecorder:
    """Stands in for an engine's sampler and keeps the logits of the last step it sampled."""

    def __init__(self, sampler) -> None:
        self.inner = sampler
        self.last: torch.Tensor | None = None

    def __getattr__(self, name: str):  # everything else the engine asks of its sampler
        return getattr(self.inner, name)

    def prepare(self, *args, **kwargs):
        return self.inner.prepare(*args, **kwargs)

    def sample(self, logits: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        self.last = logits.detach().float().clone()
        return self.inner.sample(logits, *args, **kwargs)


def next_logits(llm: "LLM", ids: list[int]) -> torch.Tensor:
    """Every logit of the next token after ``ids`` (one prefill of the whole prefix), float32 on the host. The
    request asks for log-probabilities so that every logit is computed: a greedy request's LM head may screen
    the row and leave only its largest logit exact (core/kernels/cuda/screened_head.py)."""
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
class PairVerdict:
    exact: int = 0
    near_tie: int = 0
    mismatch: int = 0
    details: list[str] | None = None

    @property
    def ok(self) -> bool:
        return self.mismatch == 0

    def __str__(self) -> str:
        return f"{self.exact} exact, {self.near_tie} near-tie, {self.mismatch} mismatch"


def near_tie_compare(llm_a: "LLM", llm_b: "LLM", prompts: list[list[int]], outs_a: list[list[int]],
                     outs_b: list[list[int]], k: int = TOP_K) -> PairVerdict:
    """Two engines' outputs for the same prompts under the near-tie rule, both sides' logits known."""
    verdict = PairVerdict(details=[])
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
