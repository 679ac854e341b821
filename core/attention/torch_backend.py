"""Attention in plain torch over the paged KV pool. Runs on any device; the reference for other backends.

Prefill runs one SDPA call per request (its new tokens attend to its cached prefix and causally to each
other); a request with nothing cached attends to its own fresh keys and values, so nothing is read back from
the pool. Decode gathers every request's keys into one padded [batch, max_len] block and runs a single masked
SDPA call, which on a CPU beats a per-request loop by a wide margin.

With an fp8 pool (core/kvcache/pool.py) the gathered keys and values are dequantised to float32 and attention
runs in float32, whatever the model's dtype, so the CPU runs it too; a prefill's fresh keys and values are
used as computed (only what is read back from the pool went through fp8).

On a float32 CPU pool where the C library builds, the plan installs the CPU wing's subclass instead
(core/kernels/cpu/attention_backend.py: decode and short prefills in C, reading the pool in place).

Keys and values are gathered with ``index_select`` over a flat list of slots: on a CPU that is several times
faster than advanced indexing with a 2-D index, and decode attention is mostly this gather. Every SDPA call
gets 4-D tensors, the shape the fused CPU kernel takes (3-D inputs fall back to the unfused math path).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core.attention.base import AttentionBackend
from core.kvcache.pool import KVPool
from core.request import Batch


@dataclass
class PrefillSeq:
    slots: torch.Tensor | None  # KV slots of positions [0, seq_len); None when nothing is cached
    q_start: int
    extend_len: int
    cached_len: int


@dataclass
class TorchPrefillMetadata:
    seqs: list[PrefillSeq]


@dataclass
class TorchDecodeMetadata:
    slots: torch.Tensor  # [batch * max_len] KV slots, row-major (entries past a request's length are masked)
    max_len: int
    # [batch, 1, 1, max_len] True where a key is visible; None for a single request, which sees every key
    # (SDPA without a mask skips turning it into additive biases: a quarter of a batch-1 call on a CPU)
    mask: torch.Tensor | None


class TorchAttentionBackend(AttentionBackend):
    def prepare_metadata(self, batch: Batch) -> None:
        if batch.is_prefill:
            seqs, start = [], 0
            for req in batch.reqs:
                slots = self.page_table[req.table_idx, : req.device_len] if req.cached_len else None
                seqs.append(PrefillSeq(slots, start, req.extend_len, req.cached_len))
                start += req.extend_len
            batch.attn_metadata = TorchPrefillMetadata(seqs)
            return
        if len(batch.reqs) == 1:
            req = batch.reqs[0]
            batch.attn_metadata = TorchDecodeMetadata(self.page_table[req.table_idx, :req.device_len],
                                                      req.device_len, None)
            return
        device = self.page_table.device
        rows = torch.tensor([r.table_idx for r in batch.reqs], device=device)
        seq_lens = torch.tensor([r.device_len for r in batch.reqs], device=device)
        max_len = max(r.device_len for r in batch.reqs)
        slots = self.page_table[rows, :max_len].reshape(-1)
        mask = torch.arange(max_len, device=device)[None, :] < seq_lens[:, None]
        batch.attn_metadata = TorchDecodeMetadata(slots, max_len, mask[:, None, None, :])

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: Batch) -> torch.Tensor:
        self.pool.store(layer, batch.out_loc, k, v)
        meta = batch.attn_metadata
        if self.pool.fp8:  # fp8 values come back as float32: attention computes in float32 throughout
            out_dtype, q, k, v = q.dtype, q.float(), k.float(), v.float()
            out = self._attend(q, k, v, layer, meta, torch.float32)
            return out.to(out_dtype)
        return self._attend(q, k, v, layer, meta, q.dtype)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                meta: TorchPrefillMetadata | TorchDecodeMetadata, dtype: torch.dtype) -> torch.Tensor:
        if isinstance(meta, TorchDecodeMetadata):
            return self._decode(q, layer, meta, dtype)
        return self._prefill(q, k, v, layer, meta, dtype)

    def _prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                 meta: TorchPrefillMetadata, dtype: torch.dtype) -> torch.Tensor:
        out = torch.empty_like(q)
        for seq in meta.seqs:
            new = slice(seq.q_start, seq.q_start + seq.extend_len)
            q_seq = _heads_first(q[new])  # [1, heads, extend, dim]
            if seq.slots is None:  # nothing cached: the fresh keys are the whole sequence
                o = F.scaled_dot_product_attention(q_seq, _heads_first(k[new]), _heads_first(v[new]),
                                                   is_causal=True, scale=self.scale, enable_gqa=True)
            else:
                total = seq.cached_len + seq.extend_len
                q_pos = torch.arange(seq.cached_len, total, device=q.device)
                visible = torch.arange(total, device=q.device)[None, :] <= q_pos[:, None]
                k_seq, v_seq = self.pool.gather(layer, seq.slots, dtype)
                o = F.scaled_dot_product_attention(q_seq, _heads_first(k_seq), _heads_first(v_seq),
                                                   attn_mask=visible, scale=self.scale, enable_gqa=True)
            out[new] = o[0].transpose(0, 1)
        return out

    def _decode(self, q: torch.Tensor, layer: int, meta: TorchDecodeMetadata, dtype: torch.dtype) -> torch.Tensor:
        shape = (q.shape[0], meta.max_len, self.num_kv_heads, self.head_dim)
        k, v = self.pool.gather(layer, meta.slots, dtype)
        k = k.view(shape).transpose(1, 2)  # [batch, kv_heads, max_len, dim]
        v = v.view(shape).transpose(1, 2)
        o = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=meta.mask, scale=self.scale,
                                           enable_gqa=True)
        return o.squeeze(2)


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """[tokens, heads, dim] -> [1, heads, tokens, dim] (a view)."""
    return x.transpose(0, 1).unsqueeze(0)
