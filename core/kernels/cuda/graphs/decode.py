"""Decode under CUDA graphs: one graph per batch size of a ladder, replayed instead of launching kernels.

A decode step of a small model is hundreds of short kernels; launched one by one from Python the GPU waits on
the CPU. A captured graph launches them all at once. Shapes are frozen at capture, so the runner keeps fixed
input buffers (token ids, positions, KV write slots) and captures sizes 1, 2, 4, 8, then every multiple of 8
up to the cap. Where the LM head screens greedy rows (core/kernels/cuda/screened_head.py), the sizes it takes
get a second graph, captured with ``greedy_logits`` set, which a step replays when it is greedy and asks for no
log-probabilities; given the sampler's greedy pick, that graph picks the tokens too (two Triton launches fewer on
the host a step, where a batch-1 step's host time is what a slow host runs out of). A batch is padded to the next
captured size: padding rows read token 0 at position 0 and write their KV into a dummy page that no request owns,
and their logits are dropped. Prefill and batches over the cap run eagerly.

A batch-1 step is well under a millisecond, and every small copy before the replay costs a few microseconds of
it. So the scheduler pads a batch as it prepares it (``Engine.padded_size``, through step.py) and gathers its
input tokens straight into the graph's buffer (``gather_inputs``); a size's positions and KV slots are adjacent
in one buffer, as they are in the scheduler's upload, so they arrive in one copy; the attention backend's plan
fills its page lists.
"""

from __future__ import annotations

import bisect
from typing import Callable

import torch
from torch import nn

from core.attention.base import AttentionBackend
from core.attention.context import forward_context
from core.request import Batch

Pick = Callable[[torch.Tensor], torch.Tensor]  # logits [rows, vocab] -> tokens [rows]


def batch_size_ladder(cap: int) -> list[int]:
    sizes = [s for s in (1, 2, 4) if s < cap] + list(range(8, cap, 8)) + [cap]
    return sorted(set(sizes))


class CudaGraphRunner:
    def __init__(self, model: nn.Module, backend: AttentionBackend, max_bs: int, dummy_slot: int,
                 dummy_page: int, device: torch.device, log: Callable[[str], None] | None = None,
                 greedy_sizes: tuple[int, ...] = (), greedy_pick: Pick | None = None) -> None:
        """``greedy_sizes``: the captured sizes that also get a greedy graph (the LM head's screen takes them);
        ``greedy_pick``: the sampler's pick of a greedy row's token, captured into those graphs when given."""
        self.model = model
        self.backend = backend
        self.sizes = batch_size_ladder(max_bs)
        self.max_bs = max_bs
        self.dummy_slot = dummy_slot
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        # a size's positions, then its KV slots: [:bs] and [bs:2 * bs], so one copy fills both
        self.positions_out_loc = torch.zeros(2 * max_bs, dtype=torch.int64, device=device)
        self.greedy_sizes = tuple(s for s in greedy_sizes if s in self.sizes)
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}  # by (size, greedy)
        self.logits: dict[tuple[int, bool], torch.Tensor] = {}
        self.tokens: dict[int, torch.Tensor] = {}  # a greedy graph's picked tokens, by size
        backend.init_cuda_graph(self.sizes, dummy_page)
        self._capture_all(device, greedy_pick)
        if log:
            greedy = f", greedy ones for {', '.join(map(str, self.greedy_sizes))}" if self.greedy_sizes else ""
            log(f"captured CUDA graphs for decode batch sizes {self.sizes[0]}..{self.sizes[-1]} "
                f"({len(self.sizes)} sizes{greedy})")

    def padded_size(self, n: int) -> int:
        """The smallest captured batch size that holds ``n`` rows."""
        return self.sizes[bisect.bisect_left(self.sizes, n)]

    def gather_inputs(self, token_pool: torch.Tensor, places: torch.Tensor) -> torch.Tensor:
        """The batch's input tokens, read from their places in the flat token pool straight into the graph's
        buffer (queued after the previous replay, on the same stream)."""
        return torch.index_select(token_pool, 0, places, out=self.input_ids[:len(places)])

    def _positions(self, bs: int) -> torch.Tensor:
        return self.positions_out_loc[:bs]

    def _out_loc(self, bs: int) -> torch.Tensor:
        return self.positions_out_loc[bs:2 * bs]

    def _static_batch(self, bs: int, reqs: list) -> Batch:
        return Batch(reqs=reqs, phase="decode", positions=self._positions(bs), input_ids=self.input_ids[:bs],
                     out_loc=self._out_loc(bs), padded_size=bs)

    @torch.inference_mode()
    def _capture_all(self, device: torch.device, greedy_pick: Pick | None) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device)
        keys = [(bs, greedy) for bs in self.sizes for greedy in (False, True) if not greedy or bs in self.greedy_sizes]
        for bs, greedy in reversed(keys):  # largest first: smaller graphs reuse its memory
            batch = self._static_batch(bs, [])
            self._pad(0, bs)  # the warm-up runs write KV: padding rows, into the dummy page
            self.backend.begin_forward(batch, graph=True)
            pick = greedy_pick if greedy else None
            with forward_context(batch, self.backend, greedy_logits=greedy):
                for _ in range(2):  # warm-up outside capture (lazy init, autotuning)
                    logits = self.model(batch.input_ids, batch.positions, None)  # every row: one token a request
                    if pick is not None:
                        pick(logits)
                torch.cuda.synchronize(device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.logits[bs, greedy] = self.model(batch.input_ids, batch.positions, None)
                    if pick is not None:
                        self.tokens[bs] = pick(self.logits[bs, greedy])
            self.graphs[bs, greedy] = graph
        torch.cuda.synchronize(device)

    def run(self, batch: Batch, greedy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits for the batch's rows, from the graph of the smallest captured size that holds it, and their
        greedy tokens where that graph picked them (a greedy graph with the sampler's pick), else None.
        ``greedy``: the step wants only each row's largest logit exact (the forward context's ``greedy_logits``),
        so a size with a greedy graph replays that one."""
        n = batch.size
        bs = self.padded_size(n)
        rows = len(batch.input_ids)  # bs when the scheduler padded the batch, else n
        if batch.input_ids.data_ptr() != self.input_ids.data_ptr():  # not gathered in place (gather_inputs)
            self.input_ids[:rows].copy_(batch.input_ids)
        span = adjacent_span(batch.positions, batch.out_loc) if rows == bs else None
        if span is not None:
            self.positions_out_loc[:2 * bs].copy_(span)
        else:
            self._positions(bs)[:rows].copy_(batch.positions)
            self._out_loc(bs)[:rows].copy_(batch.out_loc)
        if bs > rows:  # stale values from a larger batch must not write into a live request's KV slot
            self._pad(rows, bs)
        batch.padded_size = bs
        self.backend.begin_forward(batch, graph=True)
        greedy = greedy and bs in self.greedy_sizes
        self.graphs[bs, greedy].replay()
        tokens = self.tokens.get(bs) if greedy else None
        return self.logits[bs, greedy][:n], None if tokens is None else tokens[:n]

    def _pad(self, rows: int, bs: int) -> None:
        """Rows [rows, bs) of size ``bs``'s inputs as padding: token 0 at position 0, KV into the dummy slot."""
        self.input_ids[rows:bs].zero_()
        self._positions(bs)[rows:].zero_()
        self._out_loc(bs)[rows:].fill_(self.dummy_slot)


def adjacent_span(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor | None:
    """``first`` and ``second`` as one tensor when they are consecutive pieces of one contiguous buffer (the
    scheduler's upload keeps positions and KV slots so), else None."""
    if not (first.is_contiguous() and second.is_contiguous() and first.dtype == second.dtype
            and first.device == second.device and len(first) == len(second)):
        return None
    if second.data_ptr() != first.data_ptr() + first.numel() * first.element_size():
        return None
    if first.untyped_storage().data_ptr() != second.untyped_storage().data_ptr():
        return None
    return first.as_strided((2 * len(first),), (1,))
