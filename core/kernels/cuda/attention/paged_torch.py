"""The torch backend with decode in the Triton paged kernel (core/kernels/cuda/paged_decode.py): what an fp8 KV
cache runs on CUDA with ``--attention torch`` (by default an fp8 cache on CUDA takes the flashinfer backend,
which runs the same decode kernel under CUDA graphs).

Prefill stays the torch backend's (per-request SDPA; cached keys dequantised on the way); decode reads the
fp8 pages in place, which is where the bytes are. No CUDA graphs: decode steps run eagerly.
"""

from __future__ import annotations

import torch

from core.kernels.cuda.paged_decode import PagedDecodeArgs
from core.kernels.cuda.attention.paging import paged_layout
from core.attention.torch_backend import TorchAttentionBackend
from core.request import Batch
from core.transfer import upload


class PagedTorchBackend(TorchAttentionBackend):
    def prepare_metadata(self, batch: Batch) -> None:
        if batch.is_prefill:
            return super().prepare_metadata(batch)
        layout = paged_layout(self.page_table, [r.table_idx for r in batch.reqs],
                              [r.device_len for r in batch.reqs], self.pool.page_size, [r.pages for r in batch.reqs])
        device = self.page_table.device
        batch.attn_metadata = PagedDecodeArgs(upload(layout.indptr, device), layout.indices,
                                              upload(layout.last_page_len, device))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: Batch) -> torch.Tensor:
        meta = batch.attn_metadata
        if not isinstance(meta, PagedDecodeArgs):
            return super().forward(q, k, v, layer, batch)
        self.pool.store(layer, batch.out_loc, k, v)
        return meta.attend(q, self.pool, layer, self.scale)
