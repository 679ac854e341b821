"""TableManager: the rows of the page table and token pool, one per running request."""

from __future__ import annotations

import torch

from core.scheduler.fence import ReleaseFence


class TableManager:
    """Hands out rows. The token pool keeps each row's token ids on the device, so the next step's inputs are
    gathered there and sampled ids written back there without a trip through the host. It is int64, the
    sampler's own dtype, so writing a sample back is one kernel with no conversion, and is addressed through
    ``flat`` with ``row * width + column`` indices computed on the host. Padding rows of a CUDA-graph batch read
    its spare last row; writes that must go nowhere (a chunk that samples no token) land in its spare last column.
    """

    def __init__(self, max_running_req: int, max_seq_len: int, device: torch.device,
                 fence: ReleaseFence | None = None) -> None:
        self.total_rows = max_running_req
        self._free_rows = list(range(max_running_req))
        self.token_pool = torch.zeros(max_running_req + 1, max_seq_len + 1, dtype=torch.int64, device=device)
        self.flat = self.token_pool.view(-1)
        self.width = max_seq_len + 1
        self.scratch_col = max_seq_len
        self.pad_row = max_running_req
        self.fence = fence or ReleaseFence()

    @property
    def available(self) -> int:
        return len(self._free_rows)

    def allocate(self) -> int:
        return self._free_rows.pop(0)

    def free(self, row: int) -> None:
        self.fence.free(self._free_rows, [row])
