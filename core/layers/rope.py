"""Rotary position embedding with a precomputed cos/sin table indexed by position."""

from __future__ import annotations

import math

import torch
from torch import nn

from core.kernels.dispatch import TorchKernels
from core.model_config import RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling.kind == "llama3":
        inv_freq = _llama3_scale(inv_freq, scaling)
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama 3.1's rule: keep high frequencies, divide low ones by ``factor``, blend in between."""
    low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: RopeScaling) -> None:
        super().__init__()
        inv_freq = inverse_frequencies(head_dim, theta, scaling)
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        # [positions, dim]: cos of each frequency, then sin (the layout fused kernels take)
        half = inv_freq.shape[0]
        self.register_buffer("cos_sin", torch.cat((self.cos[:, :half], self.sin[:, :half]), dim=-1),
                             persistent=False)
        # sin with rotate_half's sign folded in (first half negated), for the torch kernels' one rotation of q and k
        self.register_buffer("folded_sin", torch.cat((-self.sin[:, :half], self.sin[:, half:]), dim=-1),
                             persistent=False)
        self.kernels = TorchKernels()
        self._rows: tuple[torch.Tensor, torch.dtype, torch.Tensor, torch.Tensor] | None = None

    def begin_forward(self) -> None:
        """Forget the last forward pass's table rows (the model calls this first, so no pass reads another's)."""
        self._rows = None

    def rows(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and folded sin at ``positions``, [tokens, 1, head_dim] in ``dtype``. Every layer rotates at the
        same positions, and the model hands each layer the same tensor: gathered by the first, kept for the rest
        (two small gathers per layer were a measurable share of a CPU decode step)."""
        memo = self._rows
        if memo is None or memo[0] is not positions or memo[1] != dtype:
            memo = self._rows = (positions, dtype, self.cos[positions].unsqueeze(1).to(dtype),
                                 self.folded_sin[positions].unsqueeze(1).to(dtype))
        return memo[2], memo[3]

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [tokens, heads, head_dim], k: [tokens, kv_heads, head_dim]; rotated in their own dtype."""
        return self.kernels.rope(positions, q, k, self.cos, self.sin, self.cos_sin)

    def rotate_qk(self, positions: torch.Tensor, qk: torch.Tensor,
                  num_q_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The same rotation for q and k laid side by side, qk: [tokens, q_heads + kv_heads, head_dim]."""
        return self.kernels.rope_qk(positions, qk, num_q_heads, self)
