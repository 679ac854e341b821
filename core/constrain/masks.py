"""A step's token masks: filled on the CPU from each constrained request's matcher (llguidance's bitmask, one bit
per token), uploaded in one copy, and applied to the logits before sampling: a token the grammar does not allow
next gets a logit of -inf, so neither the greedy pick nor a draw at any temperature can choose it. A request's
EOS is allowed only where its grammar accepts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from core.request import Req
from core.transfer import upload_list


@dataclass
class GrammarRows:
    """The rows of a batch that sample under a grammar this step (not a prompt chunk), and their matchers."""

    rows: list[int]
    matchers: list[Any]


def grammar_rows(reqs: Sequence[Req], samples: Sequence[bool]) -> GrammarRows | None:
    """None when no row samples under a grammar: the step runs as if structured output did not exist."""
    rows = [i for i, (req, sampled) in enumerate(zip(reqs, samples)) if sampled and req.matcher is not None]
    return GrammarRows(rows, [reqs[i].matcher for i in rows]) if rows else None


@dataclass
class TokenMasks:
    """The masks of one step: which logits rows (on the host: the usual batch under a grammar masks every row,
    which needs no indices on the device), and each row's bitmask on the device (bit j of word w allows token
    32w + j)."""

    rows: list[int]
    bits: torch.Tensor  # [len(rows), ceil(vocab / 32)] int32


_executor: Any = None


def executor() -> Any:
    """llguidance's thread pool, which fills masks and advances matchers in parallel (made at first use)."""
    global _executor
    import llguidance  # not llguidance.torch: importing it sets up torch.compile, seconds on a CPU

    if _executor is None:
        _executor = llguidance.LLExecutor()
    return _executor


def fill_bits(matchers: Sequence[Any], out: torch.Tensor) -> None:
    """Each matcher's next-token bitmask into its row of ``out`` ([len(matchers), ceil(vocab / 32)] int32, on the
    host), computed by llguidance's threads with the GIL released (core/constrain/fill.py runs it on a worker)."""
    executor().unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], out.data_ptr(), out.shape[1] * 4,
                                       len(matchers))


_BIAS_TABLES: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _bias_table(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[256, 8]: for each byte of a bitmask, the logit bias of its eight tokens (0 allowed, -inf not). Reading the
    masks through it is one gather; a boolean mask and ``masked_fill`` measured far slower on a CPU."""
    key = (device, dtype)
    if key not in _BIAS_TABLES:
        bits = (torch.arange(256)[:, None] >> torch.arange(8)) & 1
        _BIAS_TABLES[key] = torch.where(bits == 1, 0.0, float("-inf")).to(device=device, dtype=dtype)
    return _BIAS_TABLES[key]


def apply_masks(logits: torch.Tensor, masks: TokenMasks) -> torch.Tensor:
    """The logits with each masked row's disallowed tokens at -inf (a new tensor: the model's own logits stay as
    they were, for the log-probabilities a request asks for). When every row is masked (the usual batch under a
    grammar) it is one addition, without gathering the rows and scattering them back: four passes over the
    logits' size instead of ten, what a step pays for on a GPU."""
    rows, vocab = masks.bits.shape[0], logits.shape[-1]
    table = _bias_table(logits.device, logits.dtype)
    # little-endian bytes: byte b of word w holds tokens 32w + 8b ... 32w + 8b + 7, lowest bit first
    bias = table.index_select(0, masks.bits.view(torch.uint8).view(-1).int()).view(rows, -1)[:, :vocab]
    if rows == logits.shape[0]:  # the rows are distinct and in order: every row, each at its own place
        return logits + bias
    rows = upload_list(masks.rows, torch.int64, logits.device)
    return logits.index_copy(0, rows, logits.index_select(0, rows) + bias)  # index_add: far slower on a CPU


def advance(matcher: Any, token: int) -> bool:
    """Move a request's matcher past its sampled token; True when its grammar is complete (nothing but EOS may
    follow) and the request ends there, or when the token put the matcher in error (consume_token says False)."""
    return not matcher.consume_token(token) or matcher.is_stopped()

