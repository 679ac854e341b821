"""Attention on an fp8 KV pool (CUDA): flashinfer's ragged prefill, and the paged fp8 decode.

An fp8 pool (core/kvcache/pool.py) holds e4m3 values with a scale per slot and KV head, which flashinfer's
kernels do not take. Prefill therefore reads each request's whole sequence back from the pool, dequantised into
the model's dtype (one Triton gather a layer, core/kernels/cuda/fp8_gather.py, where the plan takes it; else the
pool's own gather), into flashinfer's ragged prefill. Decode reads the fp8 pages in place over the same page
lists as the paged backend, eagerly and under CUDA graphs alike: on the CUDA fp8 decode
(core/kernels/cuda/fp8_decode.py) where the plan chose it, else on the Triton paged kernel
(core/kernels/cuda/paged_decode.py). The fused QKV kernel quantises k and v on the way into the pool. A prefill runs
eagerly (the plan takes no prefill graph for an fp8 pool), and there is no small decode (it reads bf16 pages).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from core.kernels.cuda.attention.flashinfer_common import FlashInferBase
from core.kernels.cuda.attention.paging import PagedLayout
from core.kernels.cuda.fp8_gather import fp8_gather
from core.kernels.cuda.paged_decode import TILES, PagedDecodeArgs, SplitBuffers
from core.kvcache.pool import KVPool
from core.request import Batch
from core.transfer import upload

PAGED_TARGET_PROGRAMS = 512  # fp8 decode: split a request's tokens until about this many programs read
# the all-heads variant's programs each read every KV head: about two per SM (a guess, not timed)
ALL_HEADS_TARGET_PROGRAMS = 256
PAGED_MAX_SPLITS = 4
# the CUDA fp8 decode: blocks of 4 warps per (request, KV head, split), about two per SM; fewer splits win even at
# 64 rows (each split's partials cost more than the parallelism gains; docs/BENCHMARKS.md)
CUDA_TARGET_BLOCKS = 256


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
class Fp8PrefillMetadata:
    qo_indptr: torch.Tensor  # host int32: each request's query tokens
    kv_indptr: torch.Tensor  # host int32: each request's offset in kv_slots
    kv_slots: torch.Tensor  # every request's slots [0, device_len), concatenated


@dataclass
class Fp8DecodeMetadata:
    layout: PagedLayout
    paged: PagedDecodeArgs | None = None  # the decode kernel's inputs, once planned


class FlashInferFp8Backend(FlashInferBase):
    def __init__(self, pool: KVPool, page_table: torch.Tensor, num_heads: int, num_kv_heads: int,
                 head_dim: int, cuda_decode: bool = False, fast_gather: bool = False) -> None:
        """``cuda_decode``: decode on the CUDA kernel (the plan chose it where it builds and takes this model's
        heads), else on Triton's. ``fast_gather``: a prefill reads its sequences back in one Triton launch a
        layer (core/kernels/cuda/fp8_gather.py), else through the pool's gather."""
        assert pool.fp8, "a bf16 pool has a backend of its own (the plan says so)"
        super().__init__(pool, page_table, num_heads, num_kv_heads, head_dim)
        self.cuda_decode = cuda_decode
        self._gather = fp8_gather if fast_gather else KVPool.gather
        self.ragged_wrapper = self._fi.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD")
        self._split_buffers: SplitBuffers | None = None

    # ---- per step ------------------------------------------------------------------------------------------
    def prepare_metadata(self, batch: Batch) -> None:
        if batch.is_prefill:  # ragged prefill: each request's slots, no page lists
            slots = torch.cat([self.page_table[r.table_idx, :r.device_len] for r in batch.reqs])
            batch.attn_metadata = Fp8PrefillMetadata(self._qo_indptr(batch),
                                                     self._offsets([r.device_len for r in batch.reqs]), slots)
            return
        batch.attn_metadata = Fp8DecodeMetadata(self._layout(batch, batch.padded_size))

    def begin_forward(self, batch: Batch, graph: bool = False) -> None:
        meta = batch.attn_metadata
        if batch.is_prefill:
            assert not graph, "an fp8 pool's prefill runs eagerly"
            self._wait_last_plan()
            self.ragged_wrapper.plan(meta.qo_indptr, meta.kv_indptr, self.num_heads, self.num_kv_heads,
                                     self.head_dim, causal=True, sm_scale=self.scale, q_data_type=self.dtype,
                                     kv_data_type=self.dtype)
            self._mark_plan()
        elif graph:  # the kernel reads the graphs' fixed page lists as they are: no flashinfer plan
            padded_size = batch.padded_size
            layout = meta.layout if isinstance(meta, Fp8DecodeMetadata) else None
            if layout is None or layout.size != padded_size:  # not prepared for this size (capture, tests)
                layout = self._layout(batch, padded_size)
            self._copy_to_graph_buffers(layout)
            paged = self._paged_args(self._graph_indptr[: padded_size + 1], self._graph_indices,
                                     self._graph_last[:padded_size], padded_size)
            batch.attn_metadata = Fp8DecodeMetadata(layout, paged)
        else:
            lay = meta.layout
            meta.paged = self._paged_args(upload(lay.indptr, self.device), lay.indices,
                                          upload(lay.last_page_len, self.device), lay.size)

    def _paged_args(self, indptr: torch.Tensor, indices: torch.Tensor, last: torch.Tensor,
                    size: int) -> PagedDecodeArgs:
        splits = paged_splits(size, self.num_kv_heads, TILES[True].all_heads, cuda=self.cuda_decode)
        tile = replace(TILES[True], splits=splits)
        buffers = self._split_buffers
        if splits == 1 or buffers is None or len(buffers.counters) < size * self.num_kv_heads:
            buffers = None  # none needed, or an eager batch over the graphs' cap: the kernel makes its own
        return PagedDecodeArgs(indptr, indices, last, tile, buffers, cuda=self.cuda_decode)

    # ---- per layer -----------------------------------------------------------------------------------------
    def attend(self, q: torch.Tensor, layer: int, batch: Batch) -> torch.Tensor:
        meta = batch.attn_metadata
        if isinstance(meta, Fp8PrefillMetadata):  # the sequences back from the pool, in the model's dtype
            k, v = self._gather(self.pool, layer, meta.kv_slots, self.dtype)
            return self.ragged_wrapper.run(q, k, v)
        return meta.paged.attend(q, self.pool, layer, self.scale)

    # ---- CUDA graphs ---------------------------------------------------------------------------------------
    def init_cuda_graph(self, batch_sizes: list[int], dummy_page: int) -> None:
        max_bs = max(batch_sizes)
        self._init_graph_lists(max_bs, dummy_page)
        # the buffers fit either variant of the kernel: SplitBuffers.make sizes for both
        self._split_buffers = SplitBuffers.make(max_bs, self.num_heads, self.num_kv_heads, self.head_dim,
                                                PAGED_MAX_SPLITS, self.device)
