"""Attention through flashinfer's paged kernels (CUDA, bf16/fp16).

Prefill and decode both read the KV pool as pages, in the pool's layout (core/kvcache/pool.py): token-major
[pages, page_size, kv_heads, head_dim] (flashinfer's NHD) or, as the engine's plan builds a bf16 pool for this
backend, head-major [pages, kv_heads, page_size, head_dim] (HND). A step's new k and v are written into the
pool first, so a prefill is one paged call over cached prefix and new tokens together, causal with the
queries aligned to the end of each sequence. Page lists come from the page table (``paging.paged_layout``).

Planning (flashinfer's ``plan``: split-k decisions and their metadata) happens in ``begin_forward``. Under
CUDA graphs each captured batch size has its own decode wrapper whose metadata lives in fixed buffers, and
the graph is re-planned for the real batch before every replay; padding rows attend to one token of a
dummy page that no request owns. A decode batch runs flashinfer's tensor-core decode from ``tensor_core_rows``
rows up (by default every size: it reads the cache faster even for 2 query heads per KV head at mixed lengths)
and its plain kernel below, each captured size with the kernel its size takes.

With an fp8 pool (core/kvcache/pool.py: e4m3 values with a scale per slot and KV head, which flashinfer's
kernels do not take) decode runs the Triton paged kernel (core/kernels/paged_decode.py) over the same page
lists, eagerly and under CUDA graphs alike, and prefill reads each request's whole sequence back from the pool,
dequantised, into flashinfer's ragged prefill; the fused QKV kernel quantises k and v on the way into the pool.

With ``small_decode`` (decided by the engine's plan), captured batches of at most ``SMALL_DECODE_MAX_BS`` rows
skip flashinfer altogether: one Triton kernel per layer does QK-norm, RoPE, the KV write and the attention
(core/kernels/small_decode.py), reading the same fixed page-list buffers, which are then filled by plain
copies instead of a plan.

``plan`` writes its schedule into a pinned host buffer and queues a copy of it to the device. Under overlap
scheduling the next plan can come before the device has run that copy, and would overwrite the buffer under
it: every plan therefore records an event, and the next plan waits for it first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import accumulate
from typing import Any

import torch

from core.attention.base import AttentionBackend
from core.arith import pages_for
from core.attention.paging import PagedLayout, packed_page_lists, paged_layout
from core.errors import InvalidParamsError
from core.kernels.fused_qkv import QKVSpec
from core.kernels.small_decode import SMALL_DECODE_MAX_BS, SmallDecodePlan, make_plan, small_decode_attention
from core.kernels.fp8_decode_cuda import shape_unsupported_reason
from core.kernels.fp8_gather import fp8_gather
from core.kernels.paged_decode import TILES, PagedDecodeArgs, SplitBuffers
from core.kvcache.pool import KVPool
from core.request import Batch
from core.transfer import host_tensor, pinned, upload

PAGED_TARGET_PROGRAMS = 512  # fp8 decode: split a request's tokens until about this many programs read
# the all-heads variant's programs each read every KV head: about two per SM (a guess, not timed)
ALL_HEADS_TARGET_PROGRAMS = 256
PAGED_MAX_SPLITS = 4
# the CUDA fp8 decode: blocks of 4 warps per (request, KV head, split), about two per SM; fewer splits win even at
# 64 rows (each split's partials cost more than the parallelism gains; docs/BENCHMARKS.md)
CUDA_TARGET_BLOCKS = 256

# the small decode's page lists travel as one tensor, [indptr | last_page_len | indices]
# (paging.packed_page_lists): room for SMALL_DECODE_MAX_BS + 1 offsets, and 32 bytes keep the pages 16-byte aligned
SMALL_LISTS_HEADER = 8
# flashinfer's tensor-core decode (its prefill kernel) plans for 2 CTAs per SM: with more requests than that over
# the KV heads, every request is one KV chunk, yet under CUDA graphs the plan still splits (each chunk's output
# through float32 partials, then a merge kernel a layer that only copies): planned unsplit from there
PREFILL_PLAN_CTAS_PER_SM = 2
H200_SMS = 132  # where the device cannot be asked (the CPU stand-in in tests)
WORKSPACE_BYTES = 128 << 20  # flashinfer's recommended float workspace for split-k partial results
HALF_DTYPES = (torch.bfloat16, torch.float16)


def flashinfer_available() -> bool:
    try:
        import flashinfer  # noqa: F401
    except Exception:  # ImportError, or a broken install raising anything at import
        return False
    return True


def use_tensor_core_decode(num_heads: int, num_kv_heads: int, rows: int = 0, min_rows: int = 0) -> bool:
    """flashinfer's advice: its tensor-core (prefill-style) decode pays off once 4+ query heads share a KV head.
    With fewer it still does (``rows`` of at least ``min_rows``, when that is set): at the mixed lengths of a
    real batch it reads the cache faster than the plain kernel from a few dozen rows up, though with every
    request at one length the plain kernel wins small batches; so measure at real lengths (docs/BENCHMARKS.md)."""
    return num_heads // num_kv_heads >= 4 or (min_rows > 0 and rows >= min_rows)


def whole_request_rows(sm_count: int, num_kv_heads: int) -> int:
    """The smallest decode batch that flashinfer's tensor-core plan gives one KV chunk per request (more
    requests than its CTAs per KV head): from there it is planned with ``disable_split_kv``, the same chunks
    without the partials and the merge."""
    return PREFILL_PLAN_CTAS_PER_SM * sm_count // num_kv_heads + 1


def paged_splits(batch_size: int, num_kv_heads: int, all_heads: bool = False, cuda: bool = False) -> int:
    """Programs per (request, KV head) for the fp8 decode (blocks, for the CUDA kernel, whatever ``all_heads``
    says), or per request for the all-heads variant: one at large batches (enough programs already fill the device:
    splitting only adds partials to merge), a few for small ones, a power of two."""
    if cuda:
        splits = CUDA_TARGET_BLOCKS // (batch_size * num_kv_heads)
    elif all_heads:
        splits = ALL_HEADS_TARGET_PROGRAMS // batch_size
    else:
        splits = PAGED_TARGET_PROGRAMS // (batch_size * num_kv_heads)
    splits = max(1, min(PAGED_MAX_SPLITS, splits))
    return 1 << (splits.bit_length() - 1)


@dataclass
class FlashInferMetadata:
    layout: PagedLayout | None
    qo_indptr: torch.Tensor | None  # host int32, prefill only
    wrapper: Any = None  # the planned flashinfer wrapper whose run() the layers call
    small_decode: SmallDecodePlan | None = None  # a small captured batch: one Triton kernel per layer instead
    paged: PagedDecodeArgs | None = None  # fp8 decode: the Triton paged kernel instead of flashinfer's
    kv_slots: torch.Tensor | None = None  # fp8 prefill: every request's slots [0, device_len), concatenated
    kv_indptr: torch.Tensor | None = None  # fp8 prefill: host int32 offsets of each request in kv_slots
    # a batch for a small-decode graph: its page lists packed for one copy (pinned host int32), and its size
    small_lists: torch.Tensor | None = None
    small_lists_size: int = 0


class FlashInferBackend(AttentionBackend):
    def __init__(self, pool: KVPool, page_table: torch.Tensor, num_heads: int, num_kv_heads: int,
                 head_dim: int, small_decode: bool = False, pdl: bool = False, fp8_cuda: bool = False,
                 fp8_gather: bool = False, tensor_core_rows: int = 0, whole_request_decode: bool = False) -> None:
        """``small_decode``: captured batches of a few rows run the one-kernel Triton decode; the engine's plan
        sets it only where the layers take the fused QKV path (``attend_qkv``), which that kernel starts from.
        ``pdl``: that kernel runs as a programmatic dependent launch (KernelChoices.pdl). ``fp8_cuda``: an fp8
        pool's decode runs the CUDA kernel (core/kernels/fp8_decode_cuda.py) where it takes this shape.
        ``fp8_gather``: an fp8 pool's prefill reads its sequences back in one Triton launch a layer
        (core/kernels/fp8_gather.py). ``tensor_core_rows``: bf16 decode batches of at least this many rows run
        flashinfer's tensor-core decode (``use_tensor_core_decode``; 0: the plain kernel at every size).
        ``whole_request_decode``: those of at least ``whole_request_rows`` rows are planned unsplit."""
        super().__init__(pool, page_table, num_heads, num_kv_heads, head_dim)
        assert not (small_decode and pool.fp8), "the small-batch decode reads bf16 pages (the plan says so)"
        self.small_decode = small_decode
        self.pdl = pdl
        self.check_supported(pool)
        import flashinfer

        self._fi = flashinfer
        self.page_size = pool.page_size
        self.dtype = pool.dtype  # what attention computes in (an fp8 pool's values come back in it)
        self.fp8 = pool.fp8
        self.fp8_gather = self.fp8 and fp8_gather
        self.fp8_cuda = self.fp8 and fp8_cuda and not shape_unsupported_reason(num_heads, num_kv_heads, head_dim,
                                                                               pool.dtype)
        self.device = pool.k.device
        self.tensor_core_rows = tensor_core_rows
        sm_count = (torch.cuda.get_device_properties(self.device).multi_processor_count
                    if self.device.type == "cuda" else H200_SMS)
        self.unsplit_rows = whole_request_rows(sm_count, num_kv_heads) if whole_request_decode else 0
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, pool.layout)
        self._decode_wrappers: dict[bool, Any] = {}  # eager decode, by whether it runs on tensor cores
        if self.fp8:
            self.ragged_wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD")
        self._split_buffers: SplitBuffers | None = None
        self._graph_wrappers: dict[int, Any] = {}
        self._unsplit_planned: set[int] = set()  # graph sizes whose unsplit plan is made (see plan_cuda_graph)
        self._small_decode: SmallDecodePlan | None = None
        self._dummy_page = 0
        self._plan_copied: torch.cuda.Event | None = None  # the last plan's host-to-device copy has run
        self._prefill_graph_wrapper: Any = None  # a full prefill chunk's, under a CUDA graph (init_prefill_graph)

    @staticmethod
    def check_supported(pool: KVPool) -> None:
        if pool.k.device.type != "cuda":
            raise InvalidParamsError("the flashinfer attention backend needs a CUDA device; use --attention torch")
        if pool.dtype not in HALF_DTYPES:
            raise InvalidParamsError(f"the flashinfer attention backend runs bf16 or fp16, not "
                                     f"{str(pool.dtype).removeprefix('torch.')}; use --attention torch")

    # ---- per step ------------------------------------------------------------------------------------------
    def prepare_metadata(self, batch: Batch) -> None:
        if self.fp8 and batch.is_prefill:  # ragged prefill: each request's slots, no page lists
            slots = torch.cat([self.page_table[r.table_idx, :r.device_len] for r in batch.reqs])
            batch.attn_metadata = FlashInferMetadata(None, self._qo_indptr(batch), kv_slots=slots,
                                                     kv_indptr=self._offsets([r.device_len for r in batch.reqs]))
            return
        if batch.is_decode and self._small_decode is not None and 0 < batch.padded_size <= SMALL_DECODE_MAX_BS:
            lists = packed_page_lists([r.pages for r in batch.reqs], [r.device_len for r in batch.reqs],
                                      self.page_size, batch.padded_size - batch.size, self._dummy_page,
                                      SMALL_LISTS_HEADER)
            if lists is not None:  # the graph's plan copies them in one piece
                batch.attn_metadata = FlashInferMetadata(None, None, small_lists=pinned(lists, self.device),
                                                         small_lists_size=batch.padded_size)
                return
        batch.attn_metadata = FlashInferMetadata(self._layout(batch, batch.padded_size), self._qo_indptr(batch))

    def _layout(self, batch: Batch, padded_size: int) -> PagedLayout:
        """The batch's page lists, plus padding rows up to ``padded_size`` (a CUDA-graph batch)."""
        reqs = batch.reqs
        layout = paged_layout(self.page_table, [r.table_idx for r in reqs], [r.device_len for r in reqs],
                              self.page_size, [r.pages for r in reqs], padded_size - batch.size, self._dummy_page)
        return self._pinned(layout)

    def _pinned(self, layout: PagedLayout) -> PagedLayout:
        """The layout with its host parts pinned, so that plan's copies of them are queued rather than waited for."""
        return PagedLayout(pinned(layout.indptr, self.device), layout.indices,
                           pinned(layout.last_page_len, self.device))

    def _qo_indptr(self, batch: Batch) -> torch.Tensor | None:
        """A prefill's query offsets; requests of a chunk padded for the prefill graph add no query tokens."""
        if not batch.is_prefill:
            return None
        return self._offsets([r.extend_len for r in batch.reqs] + [0] * max(batch.padded_size - batch.size, 0))

    def _offsets(self, lengths: list[int]) -> torch.Tensor:
        """Where each of consecutive runs of ``lengths`` starts, and the end: pinned host int32."""
        return pinned(host_tensor([0, *accumulate(lengths)], torch.int32), self.device)

    def begin_forward(self, batch: Batch) -> None:
        meta: FlashInferMetadata = batch.attn_metadata
        if meta.layout is None and meta.small_lists is not None:  # prepared for a graph that did not run it
            meta.layout = self._layout(batch, batch.padded_size)
        lay = meta.layout
        if self.fp8:
            return self._begin_fp8(batch, meta)
        if batch.is_prefill:
            self._plan_prefill(self.prefill_wrapper, meta)
        else:
            wrapper = self._decode_wrapper(lay.size)
            self._plan_decode(wrapper, lay.indptr, lay.indices, lay.last_page_len)
            meta.wrapper = wrapper

    def tensor_cores(self, rows: int) -> bool:
        """Whether a decode batch of ``rows`` rows runs flashinfer's tensor-core decode."""
        return use_tensor_core_decode(self.num_heads, self.num_kv_heads, rows, self.tensor_core_rows)

    def _decode_wrapper(self, rows: int) -> Any:
        """The eager decode wrapper for a batch of ``rows`` rows: one per kind of kernel, made when first needed."""
        tensor_cores = self.tensor_cores(rows)
        if tensor_cores not in self._decode_wrappers:
            self._decode_wrappers[tensor_cores] = self._fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, self.pool.layout, use_tensor_cores=tensor_cores)
        return self._decode_wrappers[tensor_cores]

    def _begin_fp8(self, batch: Batch, meta: FlashInferMetadata) -> None:
        """Prefill: flashinfer's ragged kernel over the dequantised sequences; decode: the paged kernel."""
        lay = meta.layout
        if batch.is_prefill:
            self._wait_last_plan()
            self.ragged_wrapper.plan(meta.qo_indptr, meta.kv_indptr, self.num_heads, self.num_kv_heads,
                                     self.head_dim, causal=True, sm_scale=self.scale, q_data_type=self.dtype,
                                     kv_data_type=self.dtype)
            self._mark_plan()
            meta.wrapper = self.ragged_wrapper
            return
        meta.paged = self._paged_args(upload(lay.indptr, self.device), lay.indices,
                                      upload(lay.last_page_len, self.device), lay.size)

    def _paged_args(self, indptr: torch.Tensor, indices: torch.Tensor, last: torch.Tensor,
                    size: int) -> PagedDecodeArgs:
        splits = paged_splits(size, self.num_kv_heads, TILES[True].all_heads, cuda=self.fp8_cuda)
        tile = replace(TILES[True], splits=splits)
        buffers = self._split_buffers
        if splits == 1 or buffers is None or len(buffers.counters) < size * self.num_kv_heads:
            buffers = None  # none needed, or an eager batch over the graphs' cap: paged_decode makes its own
        return PagedDecodeArgs(indptr, indices, last, tile, buffers, cuda=self.fp8_cuda)

    def unsplit(self, rows: int) -> bool:
        """Whether a captured decode batch of ``rows`` rows is planned without flashinfer's KV split (an eager
        one is not split there anyway: the split is forced only under CUDA graphs)."""
        return 0 < self.unsplit_rows <= rows and self.tensor_cores(rows)

    def _plan_decode(self, wrapper: Any, indptr: torch.Tensor, indices: torch.Tensor, last: torch.Tensor,
                     unsplit: bool = False) -> None:
        self._wait_last_plan()
        extra = {"disable_split_kv": True} if unsplit else {}
        wrapper.plan(indptr, indices, last, self.num_heads, self.num_kv_heads, self.head_dim, self.page_size,
                     sm_scale=self.scale, q_data_type=self.dtype, kv_data_type=self.dtype, **extra)
        self._mark_plan()

    def _plan_prefill(self, wrapper: Any, meta: FlashInferMetadata) -> None:
        """Plan a paged prefill wrapper (the eager one, or the prefill graph's) for ``meta``, and hand it to the
        layers through it."""
        lay = meta.layout
        self._wait_last_plan()
        wrapper.plan(meta.qo_indptr, lay.indptr, lay.indices, lay.last_page_len, self.num_heads, self.num_kv_heads,
                     self.head_dim, self.page_size, causal=True, sm_scale=self.scale, q_data_type=self.dtype,
                     kv_data_type=self.dtype)
        self._mark_plan()
        meta.wrapper = wrapper

    def _wait_last_plan(self) -> None:
        if self._plan_copied is not None:
            self._plan_copied.synchronize()

    def _mark_plan(self) -> None:
        if self.device.type == "cuda":
            self._plan_copied = torch.cuda.Event()
            self._plan_copied.record()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: Batch) -> torch.Tensor:
        self.pool.store(layer, batch.out_loc, k, v)
        return self.attend(q.contiguous(), layer, batch)

    def attend(self, q: torch.Tensor, layer: int, batch: Batch) -> torch.Tensor:
        meta = batch.attn_metadata
        if meta.paged is not None:
            return meta.paged.attend(q, self.pool, layer, self.scale)
        if meta.kv_slots is not None:  # fp8 prefill: the sequences back from the pool, in the model's dtype
            gather = fp8_gather if self.fp8_gather else KVPool.gather
            k, v = gather(self.pool, layer, meta.kv_slots, self.dtype)
            return meta.wrapper.run(q, k, v)
        wrapper = meta.wrapper
        # a batch planned for the small decode has no wrapper; the one plan that enables it sends the layers to
        # attend_qkv, so this path never meets one
        assert wrapper is not None, "a small-decode batch reached attend: its layers must call attend_qkv"
        kv = self.pool.pages(layer)
        # every query row attends to at least itself, so the output needs no zeros first (flashinfer's paged
        # prefill fills a new one with them, a write as large as the output for nothing)
        return wrapper.run(q, kv, out=torch.empty_like(q))

    def attend_qkv(self, qkv: torch.Tensor, positions: torch.Tensor, spec: QKVSpec, layer: int,
                   batch: Batch) -> torch.Tensor:
        plan = batch.attn_metadata.small_decode
        if plan is None:
            return super().attend_qkv(qkv, positions, spec, layer, batch)
        return small_decode_attention(qkv, positions, spec, self.pool.k_layers[layer], self.pool.v_layers[layer],
                                      batch.out_loc, plan)

    # ---- CUDA graphs ---------------------------------------------------------------------------------------
    supports_cuda_graph = True

    def init_cuda_graph(self, batch_sizes: list[int], dummy_page: int) -> None:
        max_bs = max(batch_sizes)
        pages_per_row = pages_for(self.page_table.shape[1], self.page_size)
        # one set of buffers shared by every size: graphs replay one at a time, each re-planned first
        self._graph_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self._graph_indices = torch.zeros(max_bs * pages_per_row, dtype=torch.int32, device=self.device)
        self._graph_last = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        self._dummy_page = dummy_page
        if self.fp8:  # the paged kernel reads the fixed page lists as they are: no flashinfer wrappers
            # (the buffers fit either variant of the kernel: SplitBuffers.make sizes for both)
            self._split_buffers = SplitBuffers.make(max_bs, self.num_heads, self.num_kv_heads, self.head_dim,
                                                    PAGED_MAX_SPLITS, self.device)
            return
        if self.small_decode:
            small_bs = min(max_bs, SMALL_DECODE_MAX_BS)
            header = SMALL_LISTS_HEADER
            self._small_lists = torch.zeros(2 * header + small_bs * pages_per_row, dtype=torch.int32,
                                            device=self.device)
            self._small_decode = make_plan(small_bs, self.num_heads, self.num_kv_heads, self.head_dim,
                                           self.page_size, self.scale, self._small_lists[:header],
                                           self._small_lists[2 * header:], self._small_lists[header:2 * header],
                                           pdl=self.pdl, head_block=self.pool.head_block)
        for bs in batch_sizes:
            self._graph_wrappers[bs] = self._fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, self.pool.layout, use_cuda_graph=True, use_tensor_cores=self.tensor_cores(bs),
                paged_kv_indptr_buffer=self._graph_indptr[: bs + 1], paged_kv_indices_buffer=self._graph_indices,
                paged_kv_last_page_len_buffer=self._graph_last[:bs])

    @staticmethod
    def _copy_layout(layout: PagedLayout, indptr: torch.Tensor, indices: torch.Tensor, last: torch.Tensor) -> None:
        """The page lists into a graph's fixed buffers, queued on this stream after the previous replay (no
        flashinfer plan: the Triton kernels read the lists as they are)."""
        n, pages = layout.size, len(layout.indices)
        indptr[: n + 1].copy_(layout.indptr, non_blocking=True)
        indices[:pages].copy_(layout.indices, non_blocking=True)
        last[:n].copy_(layout.last_page_len, non_blocking=True)

    def _copy_to_graph_buffers(self, layout: PagedLayout) -> None:
        self._copy_layout(layout, self._graph_indptr, self._graph_indices, self._graph_last)

    def _plan_small_decode(self, batch: Batch, padded_size: int) -> SmallDecodePlan:
        """The small decode's page lists into its buffers: one copy where the batch was prepared for this size."""
        meta, plan = batch.attn_metadata, self._small_decode
        lists = (meta.small_lists if isinstance(meta, FlashInferMetadata) and meta.small_lists_size == padded_size
                 else None)
        if lists is not None:
            self._small_lists[:len(lists)].copy_(lists, non_blocking=True)
        else:  # not prepared for this size (capture, tests), or its pages only the page table has
            self._copy_layout(self._layout(batch, padded_size), plan.kv_indptr, plan.kv_indices, plan.kv_last)
        return plan

    def plan_cuda_graph(self, batch: Batch, padded_size: int) -> None:
        if self._small_decode is not None and padded_size <= SMALL_DECODE_MAX_BS:
            batch.attn_metadata = FlashInferMetadata(None, None, None, self._plan_small_decode(batch, padded_size))
            return
        meta = batch.attn_metadata
        layout = meta.layout if isinstance(meta, FlashInferMetadata) else None
        if layout is None or layout.size != padded_size:  # not prepared for this size (capture, tests)
            layout = self._layout(batch, padded_size)
        if self.fp8:
            self._copy_to_graph_buffers(layout)
            paged = self._paged_args(self._graph_indptr[: padded_size + 1], self._graph_indices,
                                     self._graph_last[:padded_size], padded_size)
            batch.attn_metadata = FlashInferMetadata(layout, None, paged=paged)
            return
        wrapper = self._graph_wrappers[padded_size]
        unsplit = self.unsplit(padded_size)
        if unsplit and padded_size in self._unsplit_planned:
            # an unsplit plan is a function of the batch size alone (one KV chunk a request, whatever its length:
            # flashinfer's PrefillSplitQOKVIndptr reads the lengths only to split), and each size's wrapper keeps
            # its own: once made, a replay needs only the page lists in the buffers, the copies plan would make.
            # plan itself is host work large enough to matter at every step (docs/BENCHMARKS.md)
            self._copy_to_graph_buffers(layout)
        else:
            self._plan_decode(wrapper, layout.indptr, layout.indices, layout.last_page_len, unsplit)
            if unsplit:
                self._unsplit_planned.add(padded_size)
        batch.attn_metadata = FlashInferMetadata(layout, None, wrapper)

    def init_prefill_graph(self, max_reqs: int, tokens: int, dummy_page: int) -> None:
        """A prefill wrapper with fixed buffers for a chunk of ``tokens`` tokens from up to ``max_reqs`` requests
        (core/engine/prefill_graph.py). flashinfer's graph mode fixes the number of requests, so a chunk's list
        is padded to ``max_reqs`` with requests of no query tokens that read one token of ``dummy_page``: its plan
        gives them no work."""
        self._dummy_page = dummy_page
        pages_per_row = pages_for(self.page_table.shape[1], self.page_size)
        # every request's whole page list, and room for the capture's one request over all the chunk's tokens
        pages = max_reqs * pages_per_row + pages_for(tokens, self.page_size)
        int32 = {"dtype": torch.int32, "device": self.device}
        self._prefill_graph_wrapper = self._fi.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, self.pool.layout, use_cuda_graph=True, qo_indptr_buf=torch.zeros(max_reqs + 1, **int32),
            paged_kv_indptr_buf=torch.zeros(max_reqs + 1, **int32), paged_kv_indices_buf=torch.zeros(pages, **int32),
            paged_kv_last_page_len_buf=torch.zeros(max_reqs, **int32))

    def plan_prefill_graph(self, batch: Batch) -> None:
        """Plan the prefill graph's wrapper for ``batch``, prepared with ``padded_size`` requests (the graph's
        fixed count; its metadata already padded); queued on this stream after the previous replay."""
        meta: FlashInferMetadata = batch.attn_metadata if batch.reqs else self._capture_metadata(batch)
        assert meta.layout.size == batch.padded_size == len(meta.qo_indptr) - 1, "a graph's prefill is padded first"
        self._plan_prefill(self._prefill_graph_wrapper, meta)
        batch.attn_metadata = meta

    def _capture_metadata(self, batch: Batch) -> FlashInferMetadata:
        """What the graph is captured with (a batch of no requests): one request of all the chunk's tokens over
        the dummy page, then padding requests."""
        tokens, pad = len(batch.input_ids), batch.padded_size - 1
        pages = pages_for(tokens, self.page_size)
        layout = PagedLayout(torch.tensor([0, pages], dtype=torch.int32),
                             torch.full((pages,), self._dummy_page, dtype=torch.int32, device=self.device),
                             torch.tensor([tokens - (pages - 1) * self.page_size], dtype=torch.int32))
        return FlashInferMetadata(self._pinned(layout.padded(pad, self._dummy_page)),
                                  self._offsets([tokens] + [0] * pad))
