"""The rotary position embedding's cos/sin table, indexed by position: what the kernels' ``rope_qk`` reads
(core/kernels/dispatch.py). The layer that rotates with it is core/layers/rope.py."""

from __future__ import annotations

import torch
from torch import nn


class RopeTable(nn.Module):
    def __init__(self, inv_freq: torch.Tensor, max_positions: int) -> None:
        super().__init__()
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
