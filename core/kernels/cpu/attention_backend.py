"""The torch backend with attention in C on a float32 CPU pool (core/kernels/cpu/attention.py): what the plan's
``c_attention`` installs in place of the plain torch backend.

Every decode step, and every prefill whose sequences are all short, runs from the QKV projection's output in one
C call a layer (``attend_qkv``): QK-norm, RoPE, the KV write and attention over the pool read in place, with no
gather and no padding. A longer prefill is the torch backend's, SDPA per request: each C row re-reads its
prefix, so the C path's cost grows with the square of the length, and above ``C_PREFILL_MAX_LEN`` SDPA's blocked
kernel, which reads the prefix once per block, is faster (docs/BENCHMARKS.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.attention.base import QKVSpec
from core.attention.torch_backend import TorchAttentionBackend
from core.kernels.cpu.attention import AttentionRows, CDecodeAttention
from core.kvcache.pool import KVPool
from core.request import Batch

C_PREFILL_MAX_LEN = 512


@dataclass
class CAttentionMetadata:
    """The batch as rows of the C attention, each token over its own sequence's slots."""

    rows: AttentionRows


class CAttentionBackend(TorchAttentionBackend):
    def __init__(self, pool: KVPool, page_table: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                 c_attention: CDecodeAttention) -> None:
        super().__init__(pool, page_table, num_heads, num_kv_heads, head_dim)
        self.c_attention = c_attention

    def prepare_metadata(self, batch: Batch) -> None:
        reqs = batch.reqs
        max_len = max(r.device_len for r in reqs)
        if batch.is_prefill and max_len > C_PREFILL_MAX_LEN:
            return super().prepare_metadata(batch)  # SDPA per request
        slots = self.page_table[torch.tensor([r.table_idx for r in reqs]), :max_len].reshape(-1)
        if batch.is_prefill:  # every new token is a row over its sequence's first cached_len + i + 1 slots
            lens = torch.cat([torch.arange(r.cached_len + 1, r.device_len + 1) for r in reqs])
            row_seq = torch.repeat_interleave(torch.arange(len(reqs)), torch.tensor([r.extend_len for r in reqs]))
            batch.attn_metadata = CAttentionMetadata(AttentionRows(slots, max_len, lens, row_seq))
        else:
            lens = torch.tensor([r.device_len for r in reqs])
            batch.attn_metadata = CAttentionMetadata(AttentionRows(slots, max_len, lens))

    def attend_qkv(self, qkv: torch.Tensor, positions: torch.Tensor, spec: QKVSpec, layer: int, batch: Batch,
                   fused: bool) -> torch.Tensor | None:
        meta = batch.attn_metadata
        if not isinstance(meta, CAttentionMetadata):
            return None  # a long prefill: the layer's own norm and rotation, then the torch backend's forward
        return self.c_attention.from_qkv(qkv, positions, spec, self.pool.k_layers[layer], self.pool.v_layers[layer],
                                         batch.out_loc, meta.rows, self.scale)
