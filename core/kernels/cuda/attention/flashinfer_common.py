"""What the flashinfer backends share: the workspace, the batch's page lists, the decode graphs' fixed page-list
buffers, the fence between plans, and the fused QKV path.

There are two backends, one per KV pool (the engine's plan picks it): a bf16/fp16 pool's (flashinfer_paged.py:
flashinfer's paged kernels, CUDA graphs for decode and for prefill chunks, the small-batch Triton decode)
and an fp8 pool's (flashinfer_fp8.py: flashinfer's ragged prefill over the dequantised sequences, the paged fp8
decode). Both read the pool as pages, in its layout (core/kvcache/pool.py), with page lists from the page table
(``paging.paged_layout``); a step's new k and v are written into the pool first, so attention reads cached prefix
and new tokens alike.

``plan`` writes its schedule into a pinned host buffer and queues a copy of it to the device. Under overlap
scheduling the next plan can come before the device has run that copy, and would overwrite the buffer under
it: every plan therefore records an event, and the next plan waits for it first (``_wait_last_plan``,
``_mark_plan``).

Under CUDA graphs the decode page lists live in one set of fixed buffers, shared by every captured size (graphs
replay one at a time, each planned first); padding rows attend to one token of a dummy page that no request owns.
"""

from __future__ import annotations

from abc import abstractmethod
from itertools import accumulate

import torch

from core.arith import pages_for
from core.attention.base import AttentionBackend, QKVSpec
from core.kernels.cuda.attention.paging import PagedLayout, paged_layout
from core.errors import InvalidParamsError
from core.kernels.cuda.fused_qkv import qkv_norm_rope_store
from core.kvcache.pool import KVPool
from core.request import Batch
from core.transfer import host_tensor, pinned

WORKSPACE_BYTES = 128 << 20  # flashinfer's recommended float workspace for split-k partial results
HALF_DTYPES = (torch.bfloat16, torch.float16)


def flashinfer_available() -> bool:
    try:
        import flashinfer  # noqa: F401
    except Exception:  # ImportError, or a broken install raising anything at import
        return False
    return True


def copy_layout(layout: PagedLayout, indptr: torch.Tensor, indices: torch.Tensor, last: torch.Tensor) -> None:
    """The page lists into a graph's fixed buffers, queued on this stream after the previous replay (no
    flashinfer plan: the kernels read the lists as they are)."""
    n, pages = layout.size, len(layout.indices)
    indptr[: n + 1].copy_(layout.indptr, non_blocking=True)
    indices[:pages].copy_(layout.indices, non_blocking=True)
    last[:n].copy_(layout.last_page_len, non_blocking=True)


class FlashInferBase(AttentionBackend):
    """A backend on flashinfer's wrappers; a subclass prepares, plans and attends for its kind of pool."""

    supports_cuda_graph = True

    def __init__(self, pool: KVPool, page_table: torch.Tensor, num_heads: int, num_kv_heads: int,
                 head_dim: int) -> None:
        super().__init__(pool, page_table, num_heads, num_kv_heads, head_dim)
        self.check_supported(pool)
        import flashinfer

        self._fi = flashinfer
        self.page_size = pool.page_size
        self.dtype = pool.dtype  # what attention computes in (an fp8 pool's values come back in it)
        self.device = pool.k.device
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._dummy_page = 0
        self._plan_copied: torch.cuda.Event | None = None  # the last plan's host-to-device copy has run

    @staticmethod
    def check_supported(pool: KVPool) -> None:
        if pool.k.device.type != "cuda":
            raise InvalidParamsError("the flashinfer attention backend needs a CUDA device; use --attention torch")
        if pool.dtype not in HALF_DTYPES:
            raise InvalidParamsError(f"the flashinfer attention backend runs bf16 or fp16, not "
                                     f"{str(pool.dtype).removeprefix('torch.')}; use --attention torch")

    # ---- page lists ----------------------------------------------------------------------------------------
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

    def _qo_indptr(self, batch: Batch) -> torch.Tensor:
        """A prefill's query offsets; requests of a chunk padded for the prefill graph add no query tokens."""
        return self._offsets([r.extend_len for r in batch.reqs] + [0] * max(batch.padded_size - batch.size, 0))

    def _offsets(self, lengths: list[int]) -> torch.Tensor:
        """Where each of consecutive runs of ``lengths`` starts, and the end: pinned host int32."""
        return pinned(host_tensor([0, *accumulate(lengths)], torch.int32), self.device)

    # ---- plans ---------------------------------------------------------------------------------------------
    def _wait_last_plan(self) -> None:
        if self._plan_copied is not None:
            self._plan_copied.synchronize()

    def _mark_plan(self) -> None:
        if self.device.type == "cuda":
            self._plan_copied = torch.cuda.Event()
            self._plan_copied.record()

    # ---- CUDA graphs ---------------------------------------------------------------------------------------
    def _init_graph_lists(self, max_bs: int, dummy_page: int) -> None:
        """The decode graphs' page-list buffers, for up to ``max_bs`` rows: one set shared by every size."""
        pages_per_row = pages_for(self.page_table.shape[1], self.page_size)
        self._graph_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self._graph_indices = torch.zeros(max_bs * pages_per_row, dtype=torch.int32, device=self.device)
        self._graph_last = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        self._dummy_page = dummy_page

    def _copy_to_graph_buffers(self, layout: PagedLayout) -> None:
        copy_layout(layout, self._graph_indptr, self._graph_indices, self._graph_last)

    # ---- per layer -----------------------------------------------------------------------------------------
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: Batch) -> torch.Tensor:
        self.pool.store(layer, batch.out_loc, k, v)
        return self.attend(q.contiguous(), layer, batch)

    @abstractmethod
    def attend(self, q: torch.Tensor, layer: int, batch: Batch) -> torch.Tensor:
        """Attention for a contiguous q once this step's k and v are in the pool at ``batch.out_loc``."""

    def attend_qkv(self, qkv: torch.Tensor, positions: torch.Tensor, spec: QKVSpec, layer: int, batch: Batch,
                   fused: bool) -> torch.Tensor | None:
        """Fused: QK-norm, RoPE and the KV write in one kernel (core/kernels/cuda/fused_qkv.py; an fp8 pool's k and v
        quantised on the way in), then ``attend``. Unfused: the layer's own steps, then ``forward``."""
        if not fused:
            return None
        pool = self.pool
        scales = (pool.k_scale[layer], pool.v_scale[layer]) if pool.fp8 else (None, None)
        q = qkv_norm_rope_store(qkv, spec.num_heads, spec.num_kv_heads, spec.head_dim, positions, spec.cos_sin,
                                spec.q_norm_weight, spec.k_norm_weight, spec.eps, pool.k_layers[layer],
                                pool.v_layers[layer], batch.out_loc, *scales, head_block=pool.head_block)
        return self.attend(q, layer, batch)
