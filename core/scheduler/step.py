"""A step on its way through the loop: prepared (scheduled, indices on the device), then in flight (launched)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.constrain.fill import MaskFill
from core.constrain.masks import GrammarRows
from core.engine.engine import ForwardOutput
from core.engine.sampler import SampleArgs
from core.events import KVUsage, ReqStep, WaitReason
from core.request import Batch


@dataclass
class StepReport:
    """What the step event will say about a step, recorded when it is scheduled: the requests move on after the
    launch, and the queue and pool change before the result comes back (core/scheduler/report.py)."""

    req_steps: tuple[ReqStep, ...]  # lengths as scheduled
    note: str  # why the phase was chosen, when forced
    waiting: int  # requests queued when it was scheduled
    pages_used: int
    pages_cached: int
    started: float  # perf_counter when scheduling began
    arrived: tuple[int, ...]  # uids queued since the step before
    # only when someone watches the steps (step callbacks): why each queued request waits, the pool's split
    waits: tuple[WaitReason, ...] = ()
    kv: KVUsage | None = None
    evicted_pages: int = 0
    preempted: tuple[int, ...] = ()  # uids preempted to make room for this step (core/scheduler/preempt.py)
    preempted_pages: int = 0  # the pages they gave back


@dataclass
class Prepared:
    """A scheduled batch with everything its launch needs, and the report of it for the step event."""

    batch: Batch
    sample_args: SampleArgs
    input_index: torch.Tensor | None  # decode: each input token's place in the flat token pool (read at launch)
    logits_indices: torch.Tensor
    write_index: torch.Tensor  # where each request's sampled token goes in the flat token pool
    samples: list[bool]  # per request: does this step produce its next token (False for a prompt chunk)
    report: StepReport
    grammar: GrammarRows | None = None  # the rows that sample under a grammar (None: no mask, the usual step)
    mask_fill_s: float = 0.0  # how long filling their token masks took on the host
    mask_wait_s: float = 0.0  # how long the loop waited for them (the rest of the fill overlapped other work)


@dataclass
class InFlight:
    prepared: Prepared
    output: ForwardOutput | None  # None until a batch under a grammar is sampled
    ticket: int  # the release fence's number for this launch
    logits: torch.Tensor | None = None  # a batch under a grammar: its logits, waiting for their masks
    masks: MaskFill | None = None  # ... and those masks, once their fill has started
