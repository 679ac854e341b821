"""A fast path's own step: what a wing hands the engine to run some batches without the model's forward pass.

The engine's reference step is the attention backend's plan and the model (core/models/decoder.py). A wing may
run some batches its own way, end to end: the CUDA wing replays captured graphs of a decode step or a full
prefill chunk (core/kernels/cuda/graphs/), the CPU wing runs a single request's decode step as one C call
(core/kernels/cpu/single_request.py). Each hands over an object with one method, ``run``, which either takes the
batch (its logits, and the tokens where it picked them itself) or returns None, and the engine runs the model.
The engine tries its wings' steps in order on every batch (one at most is installed outside the tests).
"""

from __future__ import annotations

from typing import Protocol

import torch

from core.request import Batch

# a step's logits [rows, vocab], and each row's greedy token where the step picked it (else None: the sampler)
StepResult = tuple[torch.Tensor, torch.Tensor | None]


class FastStep(Protocol):
    def run(self, batch: Batch, logits_indices: torch.Tensor, greedy: bool) -> StepResult | None:
        """The batch's logits at ``logits_indices`` (a prefill's last token of each request; a decode batch has
        one row a request), run inside the engine's forward context, or None where this step does not take the
        batch. ``greedy``: the step samples greedily and wants no log-probabilities (the context's
        ``greedy_logits``)."""
