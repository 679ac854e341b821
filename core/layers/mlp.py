"""The gated SiLU MLP shared by Llama and Qwen: down(silu(gate(x)) * up(x)), gate and up fused."""

from __future__ import annotations

import torch
from torch import nn

from core.layers.linear import ColumnParallelLinear, RowParallelLinear, column_blocks
from core.layers.norm import RMSNorm


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = ColumnParallelLinear(
            hidden_size, column_blocks({"gate": intermediate_size, "up": intermediate_size}), bias=False)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size)

    def forward_after_norm(self, x: torch.Tensor, residual: torch.Tensor,
                           norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """The MLP of ``norm(x + residual)``, and the new residual: the norm runs inside gate_up's kernel when
        the kernels can fold it in."""
        gate_up, residual = self.gate_up_proj.forward_after_norm(x, residual, norm)
        return self.down_proj.forward_after_silu_mul(gate_up), residual
