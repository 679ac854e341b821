"""The captured graphs as the engine's fast step (core/engine/fast_step.py): a decode batch the decode graphs hold
replays one of them, a prefill chunk prepared for the prefill graphs replays one of those; any other batch is
left to the model.

The scheduler asks here too, before it prepares a batch: how many rows the batch runs with (``padded_size``: a
captured size), and where its input tokens go (``gather_inputs``: straight into the decode graph's buffer). Each
method tests a decode batch against ``decode_max_bs`` itself rather than through a call: a batch-1 step's host
time is what a slow host runs out of.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.kernels.cuda.graphs.decode import CudaGraphRunner
from core.kernels.cuda.graphs.prefill import PrefillGraphRunner
from core.request import Batch


@dataclass
class CudaGraphs:
    decode: CudaGraphRunner | None  # decode batches of up to decode.max_bs rows
    prefill: PrefillGraphRunner | None  # prefill chunks of up to prefill.tokens tokens

    def __post_init__(self) -> None:
        # the largest decode batch a graph holds (0: none); each method below tests a batch against it inline
        self.decode_max_bs = self.decode.max_bs if self.decode is not None else 0

    def run(self, batch: Batch, logits_indices: torch.Tensor,
            greedy: bool) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """A replay's logits (and, from a greedy graph, its tokens) where a graph takes the batch, else None."""
        if batch.is_decode:
            return self.decode.run(batch, greedy) if batch.size <= self.decode_max_bs else None
        prefill = self.prefill
        if prefill is not None and prefill.can_run(batch):
            return prefill.run(batch, logits_indices), None
        return None

    def padded_size(self, batch: Batch) -> int:
        """Rows the batch will run with: a decode batch a graph takes padded to a captured size, a prefill chunk
        the prefill graphs take to their request count."""
        if batch.is_prefill:
            prefill = self.prefill
            return prefill.max_reqs if prefill is not None and prefill.fits(batch) else batch.size
        return self.decode.padded_size(batch.size) if batch.size <= self.decode_max_bs else batch.size

    def gather_inputs(self, token_pool: torch.Tensor, places: torch.Tensor, batch: Batch) -> torch.Tensor:
        """A batch's input tokens from their places in the flat token pool: a decode batch a graph takes straight
        into that graph's input buffer (one copy fewer a step)."""
        if batch.is_decode and batch.size <= self.decode_max_bs:
            return self.decode.gather_inputs(token_pool, places)
        return token_pool[places]
