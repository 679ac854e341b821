"""Which tensor-parallel rank this process is, read by the layers when they shard their weights.

The layers read it once, while they are built, and keep their own copy of the size; so the setting only has to
hold during construction (``tp_scope``) and a single-rank model built later in the same process is unaffected.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class TPInfo:
    rank: int = 0
    size: int = 1

    @property
    def is_primary(self) -> bool:
        return self.rank == 0


_tp_info = TPInfo()


def set_tp_info(info: TPInfo) -> None:
    global _tp_info
    _tp_info = info


def get_tp_info() -> TPInfo:
    return _tp_info


@contextmanager
def tp_scope(info: TPInfo) -> Iterator[TPInfo]:
    """Set the rank while building a model, and restore the previous setting afterwards."""
    previous = get_tp_info()
    set_tp_info(info)
    try:
        yield info
    finally:
        set_tp_info(previous)
