"""Prefill chunks under CUDA graphs: the host launches one graph instead of every layer's kernels.

An eager prefill chunk is every layer's kernels launched one by one from Python (the norms, four GEMMs, the
fused QKV kernel and flashinfer's attention, each behind its Python wrapper). On a fast GPU with a small model
those launches take the host longer than the kernels take the device for any chunk short of a full one: a
chunk of a few hundred tokens costs the host as long as a full chunk, and every decoding request waits for it.
As replays the chunks cost the host a plan and a few copies, and under overlap scheduling the next step is
prepared while this one runs.

Graphs are captured for a few token counts, each half the last: the full chunk (``max_extend_tokens``), then
down to a thirty-second of it. A chunk replays the smallest graph that holds its tokens: its inputs fill the
first rows of the graph's buffers, and the rows past them compute whatever the buffers held (every operation
of the pass but attention is row by row, so they touch no real row), write their KV into the dummy page, and
their logits are never read. flashinfer's graph mode takes fewer query rows than it was captured with (the
count is read on the device at each replay), but it fixes the number of requests: a chunk's request list is
padded to the graph's count with requests of no query tokens (the scheduler prepares it so:
``Engine.padded_size``), and the LM head runs on one row per request slot, of which the first ones are the
chunk's. Every graph shares one prefill wrapper, first planned for the largest, and one memory pool.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from core.attention.base import AttentionBackend
from core.attention.context import forward_context
from core.config import EngineConfig
from core.request import Batch

GRAPH_COUNT = 6  # token counts captured: the full chunk, then each half the last


def prefill_shape(config: EngineConfig, max_seq_len: int) -> tuple[int, int]:
    """(tokens, requests) the graphs are captured for: the largest chunk that can happen (a full one, or every
    row filled to the longest sequence) and at most as many requests as it has tokens."""
    tokens = min(config.max_extend_tokens, config.max_running_req * max_seq_len)
    return tokens, min(config.max_running_req, tokens)


def graph_sizes(tokens: int) -> list[int]:
    """The token counts captured for chunks of up to ``tokens`` tokens, smallest first."""
    sizes = [tokens]
    while len(sizes) < GRAPH_COUNT and sizes[-1] > 1:
        sizes.append(sizes[-1] // 2)
    return sorted(sizes)


class PrefillGraphRunner:
    def __init__(self, model: nn.Module, backend: AttentionBackend, tokens: int, max_reqs: int, dummy_slot: int,
                 dummy_page: int, device: torch.device, log: Callable[[str], None] | None = None) -> None:
        """Graphs for chunks of up to ``tokens`` tokens from at most ``max_reqs`` requests."""
        self.model = model
        self.backend = backend
        self.tokens = tokens
        self.max_reqs = max_reqs
        self.dummy_slot = dummy_slot
        self.sizes = graph_sizes(tokens)
        self.input_ids = torch.zeros(tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(tokens, dtype=torch.int64, device=device)
        self.out_loc = torch.full((tokens,), dummy_slot, dtype=torch.int64, device=device)
        # each request's last token, the row its logits come from; past the chunk's requests row 0, which every
        # graph has, and their logits are dropped
        self.logits_rows = torch.zeros(max_reqs, dtype=torch.int64, device=device)
        backend.init_prefill_graph(max_reqs, tokens, dummy_page)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.pool: tuple | None = None  # made by the first capture
        self._capture_all(device)
        if log:
            log(f"captured CUDA graphs for prefill chunks of {', '.join(f'{n:,}' for n in self.sizes)} tokens "
                f"(up to {max_reqs} requests)")

    def fits(self, batch: Batch) -> bool:
        """Whether a prefill batch, as scheduled, is one a graph runs (decided before it is prepared)."""
        return (batch.is_prefill and batch.size <= self.max_reqs
                and sum(r.extend_len for r in batch.reqs) <= self.tokens)

    def can_run(self, batch: Batch) -> bool:
        """A prefill batch prepared for the graphs: its metadata padded to their request count."""
        return batch.is_prefill and batch.padded_size == self.max_reqs and len(batch.input_ids) <= self.tokens

    def size_for(self, tokens: int) -> int:
        """The smallest captured token count that holds ``tokens``."""
        return next(n for n in self.sizes if n >= tokens)

    @torch.inference_mode()
    def _capture_all(self, device: torch.device) -> None:
        """Largest first: it plans the shared wrapper for the most rows, and smaller graphs reuse its memory."""
        for n in reversed(self.sizes):
            batch = Batch(reqs=[], phase="prefill", positions=self.positions[:n], input_ids=self.input_ids[:n],
                          out_loc=self.out_loc[:n], padded_size=self.max_reqs)
            self.backend.begin_forward(batch, graph=True)
            with forward_context(batch, self.backend):
                for _ in range(2):  # warm-up outside capture (lazy init, autotuning)
                    self._forward(n)
                self.graphs[n], self.logits[n] = self._record(n, device)

    def _forward(self, n: int) -> torch.Tensor:
        return self.model(self.input_ids[:n], self.positions[:n], self.logits_rows)

    def _record(self, n: int, device: torch.device) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """The pass over ``n`` tokens captured into a graph on the graphs' shared memory pool, on a side stream
        (as torch captures)."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=torch.cuda.Stream(device)):
            logits = self._forward(n)
        torch.cuda.synchronize(device)
        return graph, logits

    def run(self, batch: Batch, logits_rows: torch.Tensor) -> torch.Tensor:
        """Logits at ``logits_rows`` (one row per request of the batch): the inputs copied into the first rows of
        the buffers, the rows after them up to the graph's pointed at the dummy slot, the logits rows after the
        batch's at row 0, the wrapper planned for the batch, the smallest graph that holds it replayed (all queued
        on this stream)."""
        tokens = len(batch.input_ids)
        n = self.size_for(tokens)
        self.input_ids[:tokens].copy_(batch.input_ids)
        self.positions[:tokens].copy_(batch.positions)
        self.out_loc[:tokens].copy_(batch.out_loc)
        self.out_loc[tokens:n].fill_(self.dummy_slot)  # a larger chunk's slots, which these rows must not write
        rows = len(logits_rows)
        self.logits_rows[:rows].copy_(logits_rows)
        self.logits_rows[rows:].zero_()  # a larger chunk's rows may lie past a smaller graph's
        self.backend.begin_forward(batch, graph=True)
        self.graphs[n].replay()
        return self.logits[n][:rows]
