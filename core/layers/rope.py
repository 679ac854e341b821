"""Rotary position embedding: the cos/sin table (core/kernels/rope_table.py) and the rotation the kernels apply."""

from __future__ import annotations

import math

import torch

from core.kernels.dispatch import TorchKernels
from core.kernels.rope_table import RopeTable
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


class RotaryEmbedding(RopeTable):
    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: RopeScaling) -> None:
        super().__init__(inverse_frequencies(head_dim, theta, scaling), max_positions)
        self.kernels = TorchKernels()

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [tokens, heads, head_dim], k: [tokens, kv_heads, head_dim]; rotated in their own dtype."""
        return self.kernels.rope(positions, q, k, self.cos, self.sin, self.cos_sin)

    def rotate_qk(self, positions: torch.Tensor, qk: torch.Tensor,
                  num_q_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The same rotation for q and k laid side by side, qk: [tokens, q_heads + kv_heads, head_dim]."""
        return self.kernels.rope_qk(positions, qk, num_q_heads, self)
