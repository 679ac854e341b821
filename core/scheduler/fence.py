"""ReleaseFence: rows and pages given back while batches are in flight wait until those batches are done.

Under overlap scheduling a request that stopped on EOS at step N is already part of step N+1, which still writes
its sampled token into the request's token-pool row and its KV into its pages: a new owner's metadata, written
from the scheduler's stream meanwhile, would race with those writes. So a free made while a batch is in flight
is held until every batch launched before it has completed (the plain loop never holds anything).
"""

from __future__ import annotations

from collections import deque


class ReleaseFence:
    def __init__(self) -> None:
        self.launched = 0  # batches launched so far; each launch is a ticket
        self.completed = 0  # the newest ticket known to have finished on the device
        self._held: deque[tuple[int, list[int], list[int]]] = deque()  # (ticket, free list, items)

    @property
    def in_flight(self) -> bool:
        return self.completed < self.launched

    @property
    def held(self) -> int:
        """Items waiting for an in-flight batch."""
        return sum(len(items) for _, _, items in self._held)

    def launch(self) -> int:
        self.launched += 1
        return self.launched

    def complete(self, ticket: int) -> None:
        """Batch ``ticket`` (and every earlier one: the device runs them in order) has finished."""
        self.completed = max(self.completed, ticket)
        while self._held and self._held[0][0] <= self.completed:
            _, free_list, items = self._held.popleft()
            free_list.extend(items)

    def free(self, free_list: list[int], items: list[int]) -> None:
        """Put ``items`` back on ``free_list`` now, or once every batch launched so far has completed."""
        if not items:
            return
        if self.in_flight:
            self._held.append((self.launched, free_list, list(items)))
        else:
            free_list.extend(items)
