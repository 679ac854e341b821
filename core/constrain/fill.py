"""A step's token masks filled on a worker thread while the loop's thread goes on with the rest of the step.

Under overlap scheduling the masks of step N follow step N-1's tokens: they can be filled only once those tokens
have moved the matchers on, and step N samples once they are on the device. For a large batch, filling them
(llguidance's threads, the GIL released) takes about as long as all the loop's other host work, so the loop
starts the fill as soon as the matchers have moved, schedules step N+1 meanwhile, and takes the masks just
before it launches step N's sampling (core/scheduler/loops.py): the fill leaves the host's path between two
steps, where the device waits for it. Why that is safe:

* one thread at a time touches a matcher: between ``start`` and ``take`` the loop's thread only hands out
  replies, takes in messages and schedules, which move requests around (added, aborted, preempted) but never
  call their matchers; matchers move on when step N's tokens are taken, after step N's fill was taken and before
  step N+1's starts, and one worker thread runs the fills, one at a time;
* each fill writes a buffer of its own, taken when it starts (pinned on CUDA, from torch's pinned-memory cache,
  which hands a block out again only once the copy that read it has run), so no step's masks overwrite
  another's before the device has read them;
* on CUDA the worker also queues the masks' copy to the device as soon as they are filled, on a stream of its
  own: a step's masks are a few MB, which cross PCIe beside the forward pass instead of between ``take`` and the
  sampling, which the next step waits for. The device buffer is made on the loop's stream, the copy waits for
  that, and the sampling waits for the copy.

The plain loop fills inline (``background=False``): it has nothing to do meanwhile; so does the overlap loop for
a batch of fewer than ``BACKGROUND_ROWS`` rows under a grammar, whose fill takes less than handing it to the worker
and back (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import Future

import torch

from core.constrain.masks import GrammarRows, TokenMasks, fill_bits
from core.constrain.worker import single_worker

BACKGROUND_ROWS = 32  # rows under a grammar from which a step's fill runs on the worker

WORKER = "minisgl-masks"  # the one thread every fill runs on: fills never run two at once


class MaskFill:
    """One step's masks: the fill starts when this is made; ``take`` waits for it and uploads them."""

    def __init__(self, grammar: GrammarRows, vocab_size: int, device: torch.device, background: bool = True) -> None:
        self.grammar, self.device = grammar, device
        words = (vocab_size + 31) // 32
        self.bits = torch.empty((len(grammar.rows), words), dtype=torch.int32, pin_memory=device.type == "cuda")
        self.fill_s = 0.0  # how long the fill took (on the worker: until it had the GIL back after the fill)
        self.wait_s = 0.0  # how long ``take`` waited for it: the part of the fill that nothing hid
        self._done: Future | None = None
        self._copy: DeviceCopy | None = None
        if background:
            if device.type == "cuda":
                self._copy = DeviceCopy(self.bits, device)
            # wait until the worker runs: it needs the GIL to begin (llguidance reads its arguments under it, then
            # lets go), and a thread that only waits for the GIL gets it from a busy Python thread after the
            # interpreter's switch interval (5 ms), longer than the work the fill is meant to run beside
            running = threading.Event()
            self._done = single_worker(WORKER).submit(self._fill, running)
            running.wait()
        else:
            self._fill(None)
            self.wait_s = self.fill_s

    def _fill(self, running: threading.Event | None) -> None:
        started = time.perf_counter()
        if running is not None:
            running.set()
        fill_bits(self.grammar.matchers, self.bits)
        if self._copy is not None:
            self._copy.start()
        self.fill_s = time.perf_counter() - started

    def take(self) -> TokenMasks:
        """The masks on the device, once filled (the fill's error, if any, raised here on the loop's thread)."""
        if self._done is not None:
            started = time.perf_counter()
            self._done.result()
            self.wait_s = time.perf_counter() - started
        if self._copy is not None:
            bits = self._copy.take()
        else:
            bits = self.bits.to(self.device, non_blocking=True) if self.device.type == "cuda" else self.bits
        return TokenMasks(self.grammar.rows, bits)


@functools.cache
def _copy_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)


class DeviceCopy:
    """A host tensor's copy to the device, queued by the worker on a stream of its own once the tensor is filled:
    the destination is made on the loop's current stream (``ready`` says when its earlier users are done), and
    ``take`` makes that stream wait for the copy."""

    def __init__(self, host: torch.Tensor, device: torch.device) -> None:
        self.host, self.device = host, device
        self.on_device = torch.empty(host.shape, dtype=host.dtype, device=device)
        self.ready = torch.cuda.Event()
        self.ready.record(torch.cuda.current_stream(device))
        self.copied = torch.cuda.Event()

    def start(self) -> None:
        """On the worker, once ``host`` is filled."""
        stream = _copy_stream(self.device)
        stream.wait_event(self.ready)
        # the destination was made under the loop's inference mode: written here under it too, on this thread
        with torch.inference_mode(), torch.cuda.stream(stream):
            self.on_device.copy_(self.host, non_blocking=True)
            self.copied.record(stream)

    def take(self) -> torch.Tensor:
        """On the loop's thread, after ``start`` ran."""
        torch.cuda.current_stream(self.device).wait_event(self.copied)
        return self.on_device
