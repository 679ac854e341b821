"""TableManager: the rows of the page table and token pool, one per running request."""

from __future__ import annotations

import torch


class TableManager:
    """Hands out row indices. The token pool holds each row's token ids on the device, so the next step's
    inputs are gathered there and sampled ids are written back there without a trip through the host.

    The token pool has one spare column at the end: writes that must go nowhere (a chunk that samples no
    token) land in it.
    """

    def __init__(self, max_running_req: int, max_seq_len: int, device: torch.device) -> None:
        self.total_rows = max_running_req
        self._free_rows = list(range(max_running_req))
        self.token_pool = torch.zeros(max_running_req + 1, max_seq_len + 1, dtype=torch.int32, device=device)
        self.scratch_col = max_seq_len

    @property
    def available(self) -> int:
        return len(self._free_rows)

    def allocate(self) -> int:
        return self._free_rows.pop(0)

    def free(self, row: int) -> None:
        self._free_rows.append(row)
