"""What a request is while the scheduler owns it, and what a batch of them is for one forward step.

The lengths follow one convention throughout the engine:

* ``cached_len``: tokens whose KV is already in the pool (a prefix-cache hit, or earlier steps);
* ``device_len``: tokens the device knows (prompt so far plus generated tokens fed back);
* ``extend_len = device_len - cached_len``: tokens this step computes;
* ``max_device_len = prompt_len + max_tokens``: the request stops once it holds that many tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

if TYPE_CHECKING:  # only in annotations: reading prompts and their settings needs no torch
    import torch

from core.constraint import Constraint
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
MAX_PENALTY = 2.0  # presence and frequency penalties, as OpenAI's API bounds them
MAX_LOGIT_BIAS = 100.0
MAX_BIASED_TOKENS = 1024
MAX_STOP_TOKEN_IDS = 64


@dataclass(frozen=True)
class SamplingParams:
    """How one request is sampled and when it stops, validated at construction. ``temperature == 0`` (the
    default) is greedy; ``top_k == -1`` keeps every token; ``seed`` makes sampling reproducible for this request
    alone, whatever else is in the batch. ``stop``: strings that end the request when its text contains one
    (finish_reason 'stop'), the text cut before it. ``logprobs``: None for none (the fast path), else every
    generated token comes with its log-probability and the ``logprobs`` most likely alternatives (0: its own
    only), from the model's distribution before temperature, top-k and top-p.

    The logits controls (core/engine/penalties.py), each off at its default: ``presence_penalty`` and
    ``frequency_penalty`` (-2 to 2, OpenAI's) subtract from the logit of every token generated so far, once and per
    occurrence; ``repetition_penalty`` (> 0, transformers') divides a positive logit and multiplies a negative one
    of every token in the prompt or generated so far; ``logit_bias`` ({token id: -100 to 100}) is added to those
    tokens' logits; ``min_tokens`` holds back EOS (unless ``ignore_eos``) and ``stop_token_ids`` until that many
    tokens are generated. ``min_p`` (0 to 1) drops the tokens less likely than ``min_p`` times the most likely one,
    after temperature. ``stop_token_ids`` end the request when sampled, like EOS (finish_reason 'stop'; the token
    is not part of the output). Token ids are checked against the vocabulary when the request is admitted.

    ``constraint``: the output must match it (a JSON schema, a regular expression, a choice, a grammar:
    core/constraint.py); the request stops ('stop') when its grammar is complete, and EOS is allowed only where
    the grammar accepts."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # also given as {token id: bias}; kept sorted by id
    min_p: float = 0.0
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    constraint: Constraint | None = None

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
        self._check_controls()
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise InvalidParamsError(f"constraint must be None or a Constraint (core.constraint), "
                                     f"got {self.constraint!r}")

    def _check_controls(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if not _number(getattr(self, name)) or not -MAX_PENALTY <= getattr(self, name) <= MAX_PENALTY:
                raise InvalidParamsError(f"{name} must be a number in [-2, 2], got {getattr(self, name)!r}")
        if not _number(self.repetition_penalty) or not 0 < self.repetition_penalty < float("inf"):
            raise InvalidParamsError(f"repetition_penalty must be a number > 0 (1 is off), "
                                     f"got {self.repetition_penalty!r}")
        if not _number(self.min_p) or not 0 <= self.min_p <= 1:
            raise InvalidParamsError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not _integer(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidParamsError(f"min_tokens must be an integer from 0 to max_tokens ({self.max_tokens}), "
                                     f"got {self.min_tokens!r}")
        ids = self.stop_token_ids
        if not isinstance(ids, (list, tuple)) or not all(_integer(t) and t >= 0 for t in ids):
            raise InvalidParamsError(f"stop_token_ids must be a list of token ids (integers >= 0), got {ids!r}")
        if len(ids) > MAX_STOP_TOKEN_IDS:
            raise InvalidParamsError(f"stop_token_ids takes at most {MAX_STOP_TOKEN_IDS} ids, got {len(ids)}")
        object.__setattr__(self, "stop_token_ids", tuple(ids))
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))

    @property
    def penalized(self) -> bool:
        """Some penalty reads the tokens so far (the sampler then keeps counts for the request)."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def controls_logits(self) -> bool:
        """Some control changes the logits before sampling (core/engine/penalties.py); a batch in which no request
        sets one skips them entirely."""
        return self.penalized or bool(self.logit_bias) or self.min_tokens > 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _logit_bias(bias: object) -> tuple[tuple[int, float], ...]:
    """{token id: bias} or (id, bias) pairs as sorted pairs; an id may be a string of digits, as JSON's keys are."""
    pairs = bias.items() if isinstance(bias, dict) else bias
    if not isinstance(pairs, (list, tuple, type({}.items()))) or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
        raise InvalidParamsError(f"logit_bias must map token ids to biases, got {bias!r}")
    normal = {}
    for token, value in pairs:
        if isinstance(token, str) and token.isdigit():
            token = int(token)
        if not _integer(token) or token < 0:
            raise InvalidParamsError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
        if not _number(value) or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise InvalidParamsError(f"logit_bias values must be numbers in [-100, 100], got {value!r} for "
                                     f"token {token}")
        normal[token] = float(value)
    if len(normal) > MAX_BIASED_TOKENS:
        raise InvalidParamsError(f"logit_bias takes at most {MAX_BIASED_TOKENS} tokens, got {len(normal)}")
    return tuple(sorted(normal.items()))


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
    output_ids: list[int] = field(default_factory=list)  # every token generated, before a preemption too
    arrival: int = 0  # the order requests arrived in (the newest running request is the one preempted)
    preemptions: int = 0  # times it was preempted and recomputed
    # answered (finished or aborted), or preempted (a new Req takes over): results of batches in flight are dropped
    done: bool = False
    # what the sampler reads of it every step, fixed for its life: made at its first sampled step (sampler.py)
    sample_row: tuple | None = None
    # its grammar's matcher (llguidance's), under a constraint: it has consumed every generated token, so it stays
    # right when the request is recomputed from its prompt and output (core/constrain/)
    matcher: Any = None

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
