"""A batch under a grammar samples after its forward pass is launched, not with it: its token masks follow the
tokens of the step before, which under overlap scheduling the host has only once that step's results are handled.
The loops call the scheduler's ``sample_under_grammar`` then (core/scheduler/loops.py), so the masks are filled on
the host while the device runs this step's forward pass, and the rest of the step is as for any batch."""

from __future__ import annotations

import time
from typing import Callable

import torch

from core.constrain.masks import fill_masks
from core.engine.engine import Engine, ForwardOutput
from core.engine.sampler import TokenLogprobs
from core.scheduler.loops import after_current_stream
from core.scheduler.step import InFlight, Prepared

Send = Callable[[Prepared, torch.Tensor, TokenLogprobs | None], ForwardOutput]


def sample_with_masks(flight: InFlight, engine: Engine, send: Send, vocab_size: int) -> None:
    """Fill the batch's masks from its requests' matchers (which have taken every token so far), then sample and
    ``send`` the tokens on (into the token pool, and to the host). A batch launched sampled is left as it is."""
    if flight.logits is None:
        return
    prepared, started = flight.prepared, time.perf_counter()
    prepared.sample_args.masks = fill_masks(prepared.grammar, vocab_size, engine.device)
    prepared.mask_fill_s = time.perf_counter() - started
    with after_current_stream(engine.stream, engine.device):
        flight.output = send(prepared, *engine.sample(flight.logits, None, prepared.sample_args))
    flight.logits = None
