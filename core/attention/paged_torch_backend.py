"""The torch backend with decode in the Triton paged kernel (core/kernels/paged_decode.py): what an fp8 KV
cache runs on CUDA with ``--attention torch`` (by default an fp8 cache on CUDA takes the flashinfer backend,
which runs the same decode kernel under CUDA graphs).

Prefill stays the torch backend's (per-request SDPA; cached keys dequantised on the way); decode reads the
fp8 pages in place, which is where the bytes are. No CUDA graphs: decode steps run eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.kernels.paged_decode import paged_decode
from core.attention.paging import paged_layout
from core.attention.torch_backend import TorchAttentionBackend
from core.request import Batch
from core.transfer import upload


@dataclass
class PagedDecodeMetadata:
    kv_indptr: torch.Tensor  # [batch + 1] int32, on the device
    kv_indices: torch.Tensor  # int32 pages
    kv_last: torch.Tensor  # [batch] int32, on the device


class PagedTorchBackend(TorchAttentionBackend):
    def prepare_metadata(self, batch: Batch) -> None:
        if batch.is_prefill:
            return super().prepare_metadata(batch)
        layout = paged_layout(self.page_table, [r.table_idx for r in batch.reqs],
                              [r.device_len for r in batch.reqs], self.pool.page_size, [r.pages for r in batch.reqs])
        device = self.page_table.device
        batch.attn_metadata = PagedDecodeMetadata(upload(layout.indptr, device), layout.indices,
                                                  upload(layout.last_page_len, device))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: Batch) -> torch.Tensor:
        meta = batch.attn_metadata
        if not isinstance(meta, PagedDecodeMetadata):
            return super().forward(q, k, v, layer, batch)
        self.pool.store(layer, batch.out_loc, k, v)
        return paged_decode(q, self.pool, layer, meta.kv_indptr, meta.kv_indices, meta.kv_last, self.scale)
