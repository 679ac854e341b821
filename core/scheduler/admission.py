"""Which requests can never run on this engine, and why: checked before a request is queued."""

from __future__ import annotations

from dataclasses import dataclass

from core.arith import pages_for
from core.errors import ContextLengthError, RequestRejected
from core.request import SamplingParams


@dataclass(frozen=True)
class Limits:
    """What is fixed when the engine is built, so any thread may check a request against it."""

    vocab_size: int
    max_seq_len: int
    page_size: int
    num_pages: int

    @property
    def capacity_tokens(self) -> int:
        """The most tokens one request can hold: the context, or the whole KV pool if that is smaller (the last
        sampled token needs no page)."""
        return min(self.max_seq_len, self.num_pages * self.page_size + 1)


def rejection(input_ids: list[int], params: SamplingParams, limits: Limits) -> RequestRejected | None:
    """Why this request can never run within ``limits`` (an error to raise or to answer with), or None."""
    if not input_ids:
        return RequestRejected("empty prompt: give at least one token")
    if not 0 <= min(input_ids) <= max(input_ids) < limits.vocab_size:  # min and max run in C: no Python loop
        bad = next(t for t in input_ids if not 0 <= t < limits.vocab_size)
        return RequestRejected(f"token id {bad} is outside the vocabulary [0, {limits.vocab_size})")
    for field, ids in (("logit_bias", [t for t, _ in params.logit_bias]), ("stop_token_ids", params.stop_token_ids)):
        if ids and max(ids) >= limits.vocab_size:
            return RequestRejected(f"{field}: token id {max(ids)} is outside the vocabulary [0, {limits.vocab_size})",
                                   param=field)
    total = len(input_ids) + params.max_tokens
    if total > limits.max_seq_len:
        return ContextLengthError(f"prompt of {len(input_ids)} tokens plus max_tokens={params.max_tokens} exceeds "
                                  f"the context of {limits.max_seq_len} tokens")
    pages = pages_for(total - 1, limits.page_size)  # the last sampled token is never fed back: no KV
    if pages > limits.num_pages:
        return ContextLengthError(f"prompt of {len(input_ids)} tokens plus max_tokens={params.max_tokens} needs "
                                  f"{pages} KV pages but the pool has only {limits.num_pages}")
    return None
