"""Grouped-query self-attention: fused QKV projection, optional per-head QK-norm, RoPE, paged attention."""

from __future__ import annotations

import torch
from torch import nn

from core.attention.context import get_context
from core.distributed.info import get_tp_info
from core.attention.base import QKVSpec
from core.kernels.dispatch import TorchKernels
from core.layers.linear import ColumnParallelLinear, RowParallelLinear, local_kv_heads, qkv_blocks
from core.layers.norm import RMSNorm
from core.layers.rope import RotaryEmbedding
from core.model_config import ModelConfig


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.head_dim = cfg.head_dim
        self.num_heads = cfg.num_heads // get_tp_info().size
        self.num_kv_heads = local_kv_heads(cfg.num_kv_heads)[0]
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = ColumnParallelLinear(cfg.hidden_size, qkv_blocks(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim),
                                      bias=cfg.qkv_bias)
        self.o_proj = RowParallelLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.rope = rope
        self.kernels = TorchKernels()

    def forward_after_norm(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                           norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention over ``norm(x + residual)``, and the new residual: the norm runs inside the QKV projection's
        kernel when the kernels can fold it in."""
        qkv, residual = self.qkv_proj.forward_after_norm(x, residual, norm)
        return self.forward_qkv(positions, qkv), residual

    def forward_qkv(self, positions: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        """Everything after the QKV projection: QK-norm, RoPE, the KV write, attention and the output projection."""
        ctx = get_context()
        out = ctx.backend.attend_qkv(qkv, positions, self._qkv_spec(), self.layer_id, ctx.batch,
                                     fused=self.kernels.fuses_qkv)
        if out is not None:  # fused, or the backend took the batch itself
            return self.o_proj(out.reshape(-1, self.q_size))
        qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        qk = qk.view(-1, self.num_heads + self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is None:  # q and k rotate as one tensor
            q, k = self.rope.rotate_qk(positions, qk, self.num_heads)
        else:
            q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]
            q, k = self.rope(positions, self.q_norm(q), self.k_norm(k))
        out = ctx.backend.forward(q, k, v, self.layer_id, ctx.batch)
        return self.o_proj(out.reshape(-1, self.q_size))

    def _qkv_spec(self) -> QKVSpec:
        """What the fused kernels need to turn this layer's QKV output into attention's inputs (built per call:
        the tensors it names move with the model)."""
        norm = self.q_norm is not None
        return QKVSpec(self.num_heads, self.num_kv_heads, self.head_dim, self.rope.cos_sin,
                       self.q_norm.weight if norm else None, self.k_norm.weight if norm else None,
                       self.q_norm.eps if norm else 0.0)
