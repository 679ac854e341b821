"""A batch under a grammar samples after its forward pass is launched, not with it: its token masks follow the
tokens of the step before, which under overlap scheduling the host has only once that step's results are handled.
The overlap loop (core/scheduler/loops.py) starts filling the masks on a worker thread then (``start_masks``),
schedules the next step while they fill, and samples (``sample_with_masks``) just before it launches that next
step, which reads this one's tokens; the plain loop fills them inline and samples at once. Either way the masks
are filled while the device runs this step's forward pass, and the rest of the step is as for any batch."""

from __future__ import annotations

from typing import Callable

import torch

from core.constrain.fill import BACKGROUND_ROWS, MaskFill
from core.engine.engine import Engine, ForwardOutput
from core.engine.sampler import TokenLogprobs
from core.scheduler.loops import after_current_stream
from core.scheduler.step import InFlight, Prepared

Send = Callable[[Prepared, torch.Tensor, TokenLogprobs | None], ForwardOutput]


def start_masks(flight: InFlight, vocab_size: int, device: torch.device) -> None:
    """Start filling the batch's masks on the worker thread (core/constrain/fill.py): its requests' matchers have
    taken every token so far, and none of them is touched again before ``sample_with_masks``. A batch with few
    rows under a grammar is filled then, inline."""
    grammar = flight.prepared.grammar
    if flight.logits is not None and flight.masks is None and len(grammar.rows) >= BACKGROUND_ROWS:
        flight.masks = MaskFill(grammar, vocab_size, device)


def sample_with_masks(flight: InFlight, engine: Engine, send: Send, vocab_size: int) -> None:
    """Take the batch's masks (filled now if no fill was started), then sample and ``send`` the tokens on (into
    the token pool, and to the host). A batch launched sampled is left as it is."""
    if flight.logits is None:
        return
    prepared = flight.prepared
    fill = flight.masks or MaskFill(prepared.grammar, vocab_size, engine.device, background=False)
    prepared.sample_args.masks = fill.take()
    prepared.mask_fill_s, prepared.mask_wait_s = fill.fill_s, fill.wait_s
    with after_current_stream(engine.stream, engine.device):
        flight.output = send(prepared, *engine.sample(flight.logits, None, prepared.sample_args))
    flight.logits, flight.masks = None, None
