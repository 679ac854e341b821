"""The C decode step as the engine's fast step (core/engine/fast_step.py): a decode batch of one request runs as
one C call (decode.py), every other batch is left to the model.

The C step reads the request's KV slots itself: its row of the page table up to its length, the new token's
slot last (the scheduler wrote it there as it prepared the batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from core.request import Batch

# a CpuDecodeStep (decode.py), or anything called as one: (token, position, slots, screen=) -> logits [1, vocab]
DecodeCall = Callable[..., torch.Tensor]


@dataclass
class SingleRequestDecode:
    step: DecodeCall
    page_table: torch.Tensor

    def run(self, batch: Batch, logits_indices: torch.Tensor,
            greedy: bool) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The logits of a one-request decode batch (a greedy one's LM head screened), else None."""
        if not batch.is_decode or batch.size != 1:
            return None
        req = batch.reqs[0]
        slots = self.page_table[req.table_idx, :req.device_len]
        return self.step(batch.input_ids, batch.positions, slots, screen=greedy), None
