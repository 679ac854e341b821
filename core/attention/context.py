"""The forward context: the batch and attention backend of the step being run.

The attention layers read it instead of having the batch threaded through every module's signature, which
keeps the decoder's forward as plain as a textbook transformer.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from core.attention.base import AttentionBackend
from core.request import Batch


@dataclass
class ForwardContext:
    batch: Batch
    backend: AttentionBackend
    # the step samples greedily and wants no log-probabilities: of each row's logits only the largest, and the
    # first index holding it, must be exact (the LM head may screen the rest, core/kernels/cpu/screened_head.py)
    greedy_logits: bool = False


_current: ForwardContext | None = None


def get_context() -> ForwardContext:
    if _current is None:
        raise RuntimeError("attention called outside Engine.forward_batch")
    return _current


@contextmanager
def forward_context(batch: Batch, backend: AttentionBackend,
                    greedy_logits: bool = False) -> Iterator[ForwardContext]:
    global _current
    previous, _current = _current, ForwardContext(batch, backend, greedy_logits)
    try:
        yield _current
    finally:
        _current = previous
