"""What a request is while the scheduler owns it, and what a batch of them is for one forward step.

The lengths follow one convention throughout the engine:

* ``cached_len``: tokens whose KV is already in the pool (a prefix-cache hit, or earlier steps);
* ``device_len``: tokens the device knows (prompt so far plus generated tokens fed back);
* ``extend_len = device_len - cached_len``: tokens this step computes;
* ``max_device_len = prompt_len + max_tokens``: the request stops once it holds that many tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NotRequired, TypedDict

if TYPE_CHECKING:  # only in annotations: reading prompts and their settings needs no torch
    import torch

from core.errors import InvalidParamsError

Phase = Literal["prefill", "decode"]
Prompt = str | list[int]  # text, or token ids as they are


class TokenLogprob(TypedDict):
    token_id: int
    logprob: float
    top_logprobs: list[list[float]]  # [token id, logprob] pairs, best first


class Result(TypedDict):
    """One prompt's result as ``LLM.generate`` returns it: a plain dict, so it serialises to JSON as it is."""

    text: str
    token_ids: list[int]
    finish_reason: str | None  # 'stop' | 'length' | 'error' | 'abort'
    error: str | None
    prompt_tokens: int
    stop: NotRequired[str]  # the stop string that ended it, if one did
    logprobs: NotRequired[list[TokenLogprob]]  # when the request asked for them


MAX_LOGPROBS = 20  # alternatives per token, as OpenAI's API allows
MAX_STOP_STRINGS = 16


@dataclass(frozen=True)
class SamplingParams:
    """How one request is sampled and when it stops, validated at construction. ``temperature == 0`` (the
    default) is greedy; ``top_k == -1`` keeps every token; ``seed`` makes sampling reproducible for this request
    alone, whatever else is in the batch. ``stop``: strings that end the request when its text contains one
    (finish_reason 'stop'), the text cut before it. ``logprobs``: None for none (the fast path), else every
    generated token comes with its log-probability and the ``logprobs`` most likely alternatives (0: its own
    only), from the model's distribution before temperature, top-k and top-p."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidParamsError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool) \
                or not self.temperature >= 0:
            raise InvalidParamsError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k == 0 or self.top_k < -1:
            raise InvalidParamsError(f"top_k must be -1 (off) or an integer >= 1, got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or isinstance(self.top_p, bool) or not 0 < self.top_p <= 1:
            raise InvalidParamsError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not -2 ** 63 <= self.seed < 2 ** 63):
            raise InvalidParamsError(f"seed must be None or an integer that fits in 64 bits (-2**63 to 2**63 - 1), "
                                     f"got {self.seed!r}")
        if not isinstance(self.ignore_eos, bool):
            raise InvalidParamsError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise InvalidParamsError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        if len(stop) > MAX_STOP_STRINGS:
            raise InvalidParamsError(f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(stop)}")
        object.__setattr__(self, "stop", tuple(stop))  # normalised once, at construction
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise InvalidParamsError(f"logprobs must be None or an integer in [0, {MAX_LOGPROBS}], "
                                     f"got {self.logprobs!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


@dataclass(eq=False)
class Req:
    """A request admitted by the scheduler. Identity (not value) equality: it lives in sets."""

    uid: int
    input_ids: list[int]  # prompt followed by every token generated so far (host copy)
    prompt_len: int
    table_idx: int
    cached_len: int
    device_len: int
    max_device_len: int
    params: SamplingParams
    sample_seed: int  # the seed actually used: params.seed, or one drawn for this request
    pages: list[int] = field(default_factory=list)  # KV pages held, in position order
    cache_handle: object = None  # what the prefix cache locked for this request (None for the naive cache)
    output_ids: list[int] = field(default_factory=list)
    done: bool = False  # answered (finished or aborted): results of batches still in flight are dropped
    # what the sampler reads of it every step, fixed for its life: made at its first sampled step (sampler.py)
    sample_row: tuple | None = None

    @property
    def extend_len(self) -> int:
        return self.device_len - self.cached_len

    @property
    def max_kv_len(self) -> int:
        """Positions that will ever hold KV: the last sampled token is returned, never fed back."""
        return self.max_device_len - 1

    @property
    def can_decode(self) -> bool:
        """True while a generated token would still be fed back (more tokens are allowed after it)."""
        return self.device_len < self.max_device_len

    @property
    def is_chunked(self) -> bool:
        """A prefill that has not yet reached the end of its prompt produces no token this step."""
        return self.device_len < self.prompt_len

    def complete_step(self) -> None:
        """After a forward pass: the computed tokens are cached; a sampled token (if any) extends the request."""
        self.cached_len = self.device_len
        if not self.is_chunked:
            self.device_len += 1


@dataclass
class Batch:
    """The requests of one forward step, all in the same phase, plus the tensors prepared for it."""

    reqs: list[Req]
    phase: Phase
    # filled by the scheduler's prepare step
    positions: torch.Tensor | None = None
    input_ids: torch.Tensor | None = None
    out_loc: torch.Tensor | None = None  # KV slot written by each input token
    attn_metadata: object = None
    # rows after CUDA-graph padding (0: not set); of a prefill, requests after padding (the prefill graph's)
    padded_size: int = 0

    @property
    def size(self) -> int:
        return len(self.reqs)

    @property
    def is_prefill(self) -> bool:
        return self.phase == "prefill"

    @property
    def is_decode(self) -> bool:
        return self.phase == "decode"
