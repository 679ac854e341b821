"""A full prefill chunk under a CUDA graph: the host launches one graph instead of every layer's kernels.

An eager prefill chunk is every layer's kernels launched one by one from Python (the norms, four GEMMs, the
fused QKV kernel and flashinfer's attention, each behind its Python wrapper). On a fast GPU with a small model
a full chunk's launches take the host about as long as its kernels take the device, so any more host work (the
step records the live table and the trace turn on), or a slower host, leaves the device waiting; as replays
the chunks keep pace (docs/BENCHMARKS.md). A replayed graph costs
the host a plan and a few copies, and under overlap scheduling the next chunk is prepared while this one runs.

The scheduler fills a chunk to ``max_extend_tokens`` tokens whenever enough prompt tokens wait, so every full
chunk has that many tokens and one graph runs them all. What varies is the number of requests in it, and
flashinfer's prefill wrapper fixes that number under graphs: a chunk's request list is padded to the graph's
count with requests of no query tokens (the scheduler prepares it so: ``Engine.padded_size``), and the LM head
runs on one row per request slot, of which the first ones are the chunk's. A partial chunk (the last of a
prompt list, a few short prompts) runs eagerly. The captured pass writes its KV into the dummy page.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from core.attention.base import AttentionBackend
from core.attention.context import forward_context
from core.request import Batch


class PrefillGraphRunner:
    def __init__(self, model: nn.Module, backend: AttentionBackend, tokens: int, max_reqs: int, dummy_slot: int,
                 dummy_page: int, device: torch.device, log: Callable[[str], None] | None = None) -> None:
        """One graph for chunks of exactly ``tokens`` tokens from at most ``max_reqs`` requests."""
        self.model = model
        self.backend = backend
        self.tokens = tokens
        self.max_reqs = max_reqs
        self.input_ids = torch.zeros(tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(tokens, dtype=torch.int64, device=device)
        self.out_loc = torch.full((tokens,), dummy_slot, dtype=torch.int64, device=device)
        # each request's last token, the row its logits come from; rows past the chunk's requests keep whatever
        # an earlier chunk left there (a row of this chunk all the same), and their logits are dropped
        self.logits_rows = torch.zeros(max_reqs, dtype=torch.int64, device=device)
        backend.init_prefill_graph(max_reqs, tokens, dummy_page)
        self.graph, self.logits = self._capture(device)
        if log:
            log(f"captured a CUDA graph for full prefill chunks ({tokens:,} tokens, up to {max_reqs} requests)")

    def fits(self, batch: Batch) -> bool:
        """Whether a prefill batch, as scheduled, is one this graph runs (decided before it is prepared)."""
        return (batch.is_prefill and batch.size <= self.max_reqs
                and sum(r.extend_len for r in batch.reqs) == self.tokens)

    def can_run(self, batch: Batch) -> bool:
        """A prefill batch prepared for this graph: its metadata padded to the graph's request count."""
        return batch.is_prefill and batch.padded_size == self.max_reqs and len(batch.input_ids) == self.tokens

    @torch.inference_mode()
    def _capture(self, device: torch.device) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        batch = Batch(reqs=[], phase="prefill", positions=self.positions, input_ids=self.input_ids,
                      out_loc=self.out_loc, padded_size=self.max_reqs)
        self.backend.begin_forward(batch, graph=True)
        with forward_context(batch, self.backend):
            for _ in range(2):  # warm-up outside capture (lazy init, autotuning)
                self._forward()
            return self._record(device)

    def _forward(self) -> torch.Tensor:
        return self.model(self.input_ids, self.positions, self.logits_rows)

    def _record(self, device: torch.device) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """The pass captured into a graph with a memory pool of its own, on a side stream (as torch captures)."""
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=torch.cuda.graph_pool_handle(), stream=torch.cuda.Stream(device)):
            logits = self._forward()
        torch.cuda.synchronize(device)
        return graph, logits

    def run(self, batch: Batch, logits_rows: torch.Tensor) -> torch.Tensor:
        """Logits at ``logits_rows`` (one row per request of the batch): the inputs copied into the graph's
        buffers, the wrapper planned for the batch, the graph replayed (all queued on this stream)."""
        self.input_ids.copy_(batch.input_ids)
        self.positions.copy_(batch.positions)
        self.out_loc.copy_(batch.out_loc)
        rows = len(logits_rows)
        self.logits_rows[:rows].copy_(logits_rows)
        self.backend.begin_forward(batch, graph=True)
        self.graph.replay()
        return self.logits[:rows]
