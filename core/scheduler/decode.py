"""DecodeManager: the set of requests that generate one token per decode step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from core.request import Batch, Req


@dataclass
class DecodeManager:
    running: set[Req] = field(default_factory=set)

    def add(self, reqs: Iterable[Req]) -> None:
        """After a forward pass: merge this step's requests in and drop those that can no longer generate."""
        self.running = {r for r in self.running.union(reqs) if r.can_decode and not r.is_chunked}

    def remove(self, req: Req) -> None:
        self.running.discard(req)

    def find(self, uid: int) -> Req | None:
        return next((r for r in self.running if r.uid == uid), None)

    @property
    def runnable(self) -> bool:
        return bool(self.running)

    def schedule_next_batch(self) -> Batch | None:
        if not self.running:
            return None
        return Batch(reqs=sorted(self.running, key=decode_order), phase="decode")


def decode_order(req: Req) -> tuple[int, int]:
    """A decode batch's rows, shortest sequence first: attention's kernels hand out their work row by row, and so
    the batch ends sooner (docs/BENCHMARKS.md). Then by uid: a set's order differs between processes, and every
    tensor-parallel rank must agree."""
    return req.device_len, req.uid
