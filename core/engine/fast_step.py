"""A fast path's own step: what a wing hands the engine to run some batches without the model's forward pass.

The engine's reference step is the attention backend's plan and the model (core/models/decoder.py). A wing may
run some batches its own way, end to end: the CUDA wing replays captured graphs of a decode step or a full
prefill chunk (core/kernels/cuda/graphs/), the CPU wing runs a single request's decode step as one C call
(core/kernels/cpu/single_request.py). Each hands over an object with one method, ``run``, which either takes the
batch (its logits, and the tokens where it picked them itself) or returns None, and the engine runs the model.
The engine holds one such object, tried first on every batch, so a step costs one call more at most.
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


class FirstOf:
    """Several fast steps as one: the first that takes the batch runs it."""

    def __init__(self, steps: tuple[FastStep, ...]) -> None:
        self.steps = steps

    def run(self, batch: Batch, logits_indices: torch.Tensor, greedy: bool) -> StepResult | None:
        for step in self.steps:
            result = step.run(batch, logits_indices, greedy)
            if result is not None:
                return result
        return None


def first_of(*steps: FastStep | None) -> FastStep | None:
    """The steps given (None: a wing without one) as one step, tried in order; a lone step as itself, so the
    engine calls it directly; None for none."""
    present = tuple(s for s in steps if s is not None)
    if len(present) > 1:
        return FirstOf(present)
    return present[0] if present else None
