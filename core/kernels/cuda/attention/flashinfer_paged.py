"""Attention on a bf16/fp16 KV pool through flashinfer's paged kernels (CUDA).

Prefill and decode both read the pool as pages, in the pool's layout (core/kvcache/pool.py): token-major
[pages, page_size, kv_heads, head_dim] (flashinfer's NHD) or, as the engine's plan builds a bf16 pool for this
backend, head-major [pages, kv_heads, page_size, head_dim] (HND). A prefill is one paged call over cached prefix
and new tokens together, causal with the queries aligned to the end of each sequence.

Planning (flashinfer's ``plan``: split-k decisions and their metadata) happens in ``begin_forward``. Under
CUDA graphs each captured batch size has its own decode wrapper whose metadata lives in the fixed page-list
buffers (flashinfer_common.py), and the graph is re-planned for the real batch before every replay. A decode
batch runs flashinfer's tensor-core decode from the plan's ``tensor_core_decode_rows`` rows up
(by default every size: it reads the cache faster even for 2 query heads per KV head at mixed lengths) and its
plain kernel below, each captured size with the kernel its size takes. From ``whole_request_rows`` rows a
captured tensor-core decode is planned unsplit, and that plan, a function of the size alone, is made once.

Captured batches of a few rows can run the small decode instead (small_decode_graphs.py), and prefill chunks
run under graphs of their own (core/kernels/cuda/graphs/prefill.py), all on one prefill wrapper with fixed
buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from core.arith import pages_for
from core.kernels.cuda.attention.flashinfer_common import FlashInferBase
from core.kernels.cuda.attention.paging import PagedLayout
from core.kernels.cuda.attention.small_decode_graphs import SmallDecodeGraphs, SmallDecodeMetadata
from core.attention.base import QKVSpec
from core.kernels.cuda.small_decode import small_decode_attention
from core.kvcache.pool import KVPool
from core.request import Batch

# flashinfer's tensor-core decode (its prefill kernel) plans for 2 CTAs per SM: with more requests than that over
# the KV heads, every request is one KV chunk, yet under CUDA graphs the plan still splits (each chunk's output
# through float32 partials, then a merge kernel a layer that only copies): planned unsplit from there
PREFILL_PLAN_CTAS_PER_SM = 2
H200_SMS = 132  # where the device cannot be asked (the CPU stand-in in tests)


def use_tensor_core_decode(num_heads: int, num_kv_heads: int, rows: int = 0, min_rows: int = 0) -> bool:
    """flashinfer's advice: its tensor-core (prefill-style) decode pays off once 4+ query heads share a KV head.
    With fewer it still does (``rows`` of at least ``min_rows``, when that is set): at the mixed lengths of a
    real batch it reads the cache faster than the plain kernel from a few dozen rows up, though with every
    request at one length the plain kernel wins small batches; so measure at real lengths (docs/BENCHMARKS.md).
    The engine's plan applies it once, as the row count from which this backend takes tensor cores."""
    return num_heads // num_kv_heads >= 4 or (min_rows > 0 and rows >= min_rows)


def whole_request_rows(sm_count: int, num_kv_heads: int) -> int:
    """The smallest decode batch that flashinfer's tensor-core plan gives one KV chunk per request (more
    requests than its CTAs per KV head): from there it is planned with ``disable_split_kv``, the same chunks
    without the partials and the merge."""
    return PREFILL_PLAN_CTAS_PER_SM * sm_count // num_kv_heads + 1


@dataclass
class PagedMetadata:
    layout: PagedLayout
    qo_indptr: torch.Tensor | None  # host int32, prefill only
    wrapper: Any = None  # the planned flashinfer wrapper whose run() the layers call
    # a prefill's longest query, which flashinfer's plan would otherwise find with Python's max() over a host
    # tensor of every (padded) request, element by element: host time on every prefill step
    max_q_len: int | None = None


class FlashInferPagedBackend(FlashInferBase):
    def __init__(self, pool: KVPool, page_table: torch.Tensor, num_heads: int, num_kv_heads: int,
                 head_dim: int, small_decode: bool = False, pdl: bool = False, tensor_core_rows: int = 0,
                 whole_request_decode: bool = False) -> None:
        """``small_decode``: captured batches of a few rows run the one-kernel Triton decode; the engine's plan
        sets it only where the layers take the fused QKV path, which that kernel starts from. ``pdl``: that kernel
        runs as a programmatic dependent launch (KernelChoices.pdl). ``tensor_core_rows``: decode batches of at
        least this many rows run flashinfer's tensor-core decode (0: the plain kernel at every size).
        ``whole_request_decode``: those of at least ``whole_request_rows`` rows are planned unsplit."""
        assert not pool.fp8, "an fp8 pool has a backend of its own (the plan says so)"
        super().__init__(pool, page_table, num_heads, num_kv_heads, head_dim)
        self.small_decode = small_decode
        self.pdl = pdl
        self.tensor_core_rows = tensor_core_rows
        sm_count = (torch.cuda.get_device_properties(self.device).multi_processor_count
                    if self.device.type == "cuda" else H200_SMS)
        self.unsplit_rows = whole_request_rows(sm_count, num_kv_heads) if whole_request_decode else 0
        self.prefill_wrapper = self._fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace, pool.layout)
        self._decode_wrappers: dict[bool, Any] = {}  # eager decode, by whether it runs on tensor cores
        self._graph_wrappers: dict[int, Any] = {}
        self._unsplit_planned: set[int] = set()  # graph sizes whose unsplit plan is made (see _plan_decode_graph)
        self._small_decode: SmallDecodeGraphs | None = None  # made with the decode graphs
        self._prefill_graph_wrapper: Any = None  # the prefill graphs', planned for each replay (init_prefill_graph)

    def tensor_cores(self, rows: int) -> bool:
        """Whether a decode batch of ``rows`` rows runs flashinfer's tensor-core decode."""
        return 0 < self.tensor_core_rows <= rows

    def unsplit(self, rows: int) -> bool:
        """Whether a captured decode batch of ``rows`` rows is planned without flashinfer's KV split (an eager
        one is not split there anyway: the split is forced only under CUDA graphs)."""
        return 0 < self.unsplit_rows <= rows and self.tensor_cores(rows)

    # ---- per step ------------------------------------------------------------------------------------------
    def prepare_metadata(self, batch: Batch) -> None:
        small = self._small_decode
        if batch.is_decode and small is not None and small.takes(batch.padded_size):
            lists = small.prepare(batch, self._dummy_page)
            if lists is not None:  # the graph's plan copies them in one piece
                batch.attn_metadata = lists
                return
        if not batch.is_prefill:
            batch.attn_metadata = PagedMetadata(self._layout(batch, batch.padded_size), None)
            return
        batch.attn_metadata = PagedMetadata(self._layout(batch, batch.padded_size), self._qo_indptr(batch),
                                            max_q_len=max((r.extend_len for r in batch.reqs), default=None))

    def begin_forward(self, batch: Batch, graph: bool = False) -> None:
        if graph:
            return self._plan_prefill_graph(batch) if batch.is_prefill else self._plan_decode_graph(batch)
        meta = batch.attn_metadata
        if not isinstance(meta, PagedMetadata):  # prepared for a small-decode graph that did not run it
            meta = batch.attn_metadata = PagedMetadata(self._layout(batch, batch.padded_size), None)
        if batch.is_prefill:
            return self._plan_prefill(self.prefill_wrapper, meta)
        wrapper = self._decode_wrapper(meta.layout.size)
        self._plan_decode(wrapper, meta.layout)
        meta.wrapper = wrapper

    def _decode_wrapper(self, rows: int) -> Any:
        """The eager decode wrapper for a batch of ``rows`` rows: one per kind of kernel, made when first needed."""
        tensor_cores = self.tensor_cores(rows)
        if tensor_cores not in self._decode_wrappers:
            self._decode_wrappers[tensor_cores] = self._fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, self.pool.layout, use_tensor_cores=tensor_cores)
        return self._decode_wrappers[tensor_cores]

    def _plan_decode(self, wrapper: Any, layout: PagedLayout, unsplit: bool = False) -> None:
        self._wait_last_plan()
        extra = {"disable_split_kv": True} if unsplit else {}
        wrapper.plan(layout.indptr, layout.indices, layout.last_page_len, self.num_heads, self.num_kv_heads,
                     self.head_dim, self.page_size, sm_scale=self.scale, q_data_type=self.dtype,
                     kv_data_type=self.dtype, **extra)
        self._mark_plan()

    def _plan_prefill(self, wrapper: Any, meta: PagedMetadata) -> None:
        """Plan a paged prefill wrapper (the eager one, or the prefill graph's) for ``meta``, and hand it to the
        layers through it."""
        lay = meta.layout
        self._wait_last_plan()
        wrapper.plan(meta.qo_indptr, lay.indptr, lay.indices, lay.last_page_len, self.num_heads, self.num_kv_heads,
                     self.head_dim, self.page_size, causal=True, sm_scale=self.scale, q_data_type=self.dtype,
                     kv_data_type=self.dtype, max_token_per_sequence=meta.max_q_len)
        self._mark_plan()
        meta.wrapper = wrapper

    # ---- per layer -----------------------------------------------------------------------------------------
    def attend(self, q: torch.Tensor, layer: int, batch: Batch) -> torch.Tensor:
        meta = batch.attn_metadata
        # a batch planned for the small decode has no wrapper; the one plan that enables it sends the layers to
        # attend_qkv's fused path, so this path never meets one
        assert isinstance(meta, PagedMetadata), "a small-decode batch reached attend: its layers must be fused"
        kv = self.pool.pages(layer)
        # every query row attends to at least itself, so the output needs no zeros first (flashinfer's paged
        # prefill fills a new one with them, a write as large as the output for nothing)
        return meta.wrapper.run(q, kv, out=torch.empty_like(q))

    def attend_qkv(self, qkv: torch.Tensor, positions: torch.Tensor, spec: QKVSpec, layer: int, batch: Batch,
                   fused: bool) -> torch.Tensor | None:
        meta = batch.attn_metadata
        if not isinstance(meta, SmallDecodeMetadata):
            return super().attend_qkv(qkv, positions, spec, layer, batch, fused)
        return small_decode_attention(qkv, positions, spec, self.pool.k_layers[layer], self.pool.v_layers[layer],
                                      batch.out_loc, meta.plan)

    # ---- decode under CUDA graphs --------------------------------------------------------------------------
    def init_cuda_graph(self, batch_sizes: list[int], dummy_page: int) -> None:
        max_bs = max(batch_sizes)
        self._init_graph_lists(max_bs, dummy_page)
        if self.small_decode:
            self._small_decode = SmallDecodeGraphs(
                max_bs, pages_for(self.page_table.shape[1], self.page_size), self.num_heads, self.num_kv_heads,
                self.head_dim, self.page_size, self.scale, self.pdl, self.pool.head_block, self.device)
        for bs in batch_sizes:
            self._graph_wrappers[bs] = self._fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, self.pool.layout, use_cuda_graph=True, use_tensor_cores=self.tensor_cores(bs),
                paged_kv_indptr_buffer=self._graph_indptr[: bs + 1], paged_kv_indices_buffer=self._graph_indices,
                paged_kv_last_page_len_buffer=self._graph_last[:bs])

    def _plan_decode_graph(self, batch: Batch) -> None:
        padded_size = batch.padded_size
        if self._small_decode is not None and self._small_decode.takes(padded_size):
            batch.attn_metadata = self._small_decode.fill(batch, lambda: self._layout(batch, padded_size))
            return
        meta = batch.attn_metadata
        layout = meta.layout if isinstance(meta, PagedMetadata) else None
        if layout is None or layout.size != padded_size:  # not prepared for this size (capture, tests)
            layout = self._layout(batch, padded_size)
        wrapper = self._graph_wrappers[padded_size]
        unsplit = self.unsplit(padded_size)
        if unsplit and padded_size in self._unsplit_planned:
            # an unsplit plan is a function of the batch size alone (one KV chunk a request, whatever its length:
            # flashinfer's PrefillSplitQOKVIndptr reads the lengths only to split), and each size's wrapper keeps
            # its own: once made, a replay needs only the page lists in the buffers, the copies plan would make.
            # plan itself is host work large enough to matter at every step (docs/BENCHMARKS.md)
            self._copy_to_graph_buffers(layout)
        else:
            self._plan_decode(wrapper, layout, unsplit)
            if unsplit:
                self._unsplit_planned.add(padded_size)
        batch.attn_metadata = PagedMetadata(layout, None, wrapper)

    # ---- prefill chunks under CUDA graphs ----------------------------------------------------------------
    def init_prefill_graph(self, max_reqs: int, tokens: int, dummy_page: int) -> None:
        """A prefill wrapper with fixed buffers for chunks of up to ``tokens`` tokens from up to ``max_reqs``
        requests (core/kernels/cuda/graphs/prefill.py), shared by every prefill graph: its first plan, the largest
        graph's capture, fixes the rows it is sized for; later plans may have fewer. flashinfer's graph mode fixes
        the number of requests, so a chunk's list is padded to ``max_reqs`` with requests of no query tokens that
        read one token of ``dummy_page``: its plan gives them no work."""
        self._dummy_page = dummy_page
        pages_per_row = pages_for(self.page_table.shape[1], self.page_size)
        # every request's whole page list, and room for the capture's one request over all the chunk's tokens
        pages = max_reqs * pages_per_row + pages_for(tokens, self.page_size)
        int32 = {"dtype": torch.int32, "device": self.device}
        self._prefill_graph_wrapper = self._fi.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, self.pool.layout, use_cuda_graph=True, qo_indptr_buf=torch.zeros(max_reqs + 1, **int32),
            paged_kv_indptr_buf=torch.zeros(max_reqs + 1, **int32), paged_kv_indices_buf=torch.zeros(pages, **int32),
            paged_kv_last_page_len_buf=torch.zeros(max_reqs, **int32))

    def _plan_prefill_graph(self, batch: Batch) -> None:
        """Plan the prefill graph's wrapper for ``batch``, prepared with ``padded_size`` requests (the graph's
        fixed count; its metadata already padded); queued on this stream after the previous replay."""
        meta: PagedMetadata = batch.attn_metadata if batch.reqs else self._capture_metadata(batch)
        assert meta.layout.size == batch.padded_size == len(meta.qo_indptr) - 1, "a graph's prefill is padded first"
        self._plan_prefill(self._prefill_graph_wrapper, meta)
        batch.attn_metadata = meta

    def _capture_metadata(self, batch: Batch) -> PagedMetadata:
        """What a graph is captured with (a batch of no requests): one request of all its tokens over the dummy
        page, then padding requests."""
        tokens, pad = len(batch.input_ids), batch.padded_size - 1
        pages = pages_for(tokens, self.page_size)
        layout = PagedLayout(torch.tensor([0, pages], dtype=torch.int32),
                             torch.full((pages,), self._dummy_page, dtype=torch.int32, device=self.device),
                             torch.tensor([tokens - (pages - 1) * self.page_size], dtype=torch.int32))
        return PagedMetadata(self._pinned(layout.padded(pad, self._dummy_page)),
                             self._offsets([tokens] + [0] * pad), max_q_len=tokens)
