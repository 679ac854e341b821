"""Which tensor-parallel rank this process is, read by the layers when they shard their weights."""

from __future__ import annotations

from dataclasses import dataclass


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
