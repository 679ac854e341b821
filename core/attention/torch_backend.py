"""Attention in plain torch over the paged KV pool. Runs on any device; the reference for other backends.

Prefill runs one SDPA call per request (its new tokens attend to its cached prefix and causally to each
other). Decode gathers every request's keys into one padded [batch, max_len] block and runs a single masked
SDPA call, which on a CPU beats a per-request loop by a wide margin.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core.attention.base import AttentionBackend
from core.request import Batch


@dataclass
class PrefillSeq:
    slots: torch.Tensor  # KV slots of positions [0, seq_len)
    q_start: int
    extend_len: int
    cached_len: int


@dataclass
class TorchPrefillMetadata:
    seqs: list[PrefillSeq]


@dataclass
class TorchDecodeMetadata:
    slots: torch.Tensor  # [batch, max_len] KV slots (entries past a request's length are masked)
    mask: torch.Tensor  # [batch, 1, 1, max_len] True where a key is visible


class TorchAttentionBackend(AttentionBackend):
    def prepare_metadata(self, batch: Batch) -> None:
        rows = [r.table_idx for r in batch.reqs]
        if batch.is_prefill:
            seqs, start = [], 0
            for req in batch.reqs:
                seqs.append(PrefillSeq(self.page_table[req.table_idx, : req.device_len], start, req.extend_len,
                                       req.cached_len))
                start += req.extend_len
            batch.attn_metadata = TorchPrefillMetadata(seqs)
            return
        device = self.page_table.device
        seq_lens = torch.tensor([r.device_len for r in batch.reqs], device=device)
        max_len = max(r.device_len for r in batch.reqs)
        slots = self.page_table[torch.tensor(rows, device=device), :max_len]
        mask = torch.arange(max_len, device=device)[None, :] < seq_lens[:, None]
        batch.attn_metadata = TorchDecodeMetadata(slots, mask[:, None, None, :])

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: Batch) -> torch.Tensor:
        self.pool.store(layer, batch.out_loc, k, v)
        k_cache, v_cache = self.pool.k[layer], self.pool.v[layer]
        meta = batch.attn_metadata
        if isinstance(meta, TorchDecodeMetadata):
            return self._decode(q, k_cache, v_cache, meta)
        out = torch.empty_like(q)
        for seq in meta.seqs:
            q_seq = q[seq.q_start: seq.q_start + seq.extend_len].transpose(0, 1)  # [heads, ext, dim]
            k_seq = k_cache[seq.slots].transpose(0, 1)  # [kv_heads, seq, dim]
            v_seq = v_cache[seq.slots].transpose(0, 1)
            if seq.cached_len == 0:
                o = F.scaled_dot_product_attention(q_seq, k_seq, v_seq, is_causal=True, scale=self.scale,
                                                   enable_gqa=True)
            else:
                total = seq.cached_len + seq.extend_len
                q_pos = torch.arange(seq.cached_len, total, device=q.device)
                visible = torch.arange(total, device=q.device)[None, :] <= q_pos[:, None]
                o = F.scaled_dot_product_attention(q_seq, k_seq, v_seq, attn_mask=visible, scale=self.scale,
                                                   enable_gqa=True)
            out[seq.q_start: seq.q_start + seq.extend_len] = o.transpose(0, 1)
        return out

    def _decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: TorchDecodeMetadata) -> torch.Tensor:
        k = k_cache[meta.slots].transpose(1, 2)  # [batch, kv_heads, max_len, dim]
        v = v_cache[meta.slots].transpose(1, 2)
        o = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=meta.mask, scale=self.scale,
                                           enable_gqa=True)
        return o.squeeze(2)
