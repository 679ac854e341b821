"""Which tensor-parallel rank this process is, read by the layers once, while they are built, to shard their
weights; they keep their own copy of the size, so the setting only holds during construction (``tp_scope``)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class TPInfo:
    rank: int = 0
    size: int = 1


_tp_info = TPInfo()


def get_tp_info() -> TPInfo:
    return _tp_info


@contextmanager
def tp_scope(info: TPInfo) -> Iterator[TPInfo]:
    """Set the rank while building a model, and restore the previous setting afterwards."""
    global _tp_info
    previous, _tp_info = _tp_info, info
    try:
        yield info
    finally:
        _tp_info = previous
