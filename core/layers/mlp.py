"""The gated SiLU MLP shared by Llama and Qwen: down(silu(gate(x)) * up(x)), gate and up fused."""

from __future__ import annotations

import torch
from torch import nn

from core.layers.kernels import TorchKernels
from core.layers.linear import RowParallelLinear, ShardedLinear, column_blocks


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = ShardedLinear(
            hidden_size, column_blocks({"gate": intermediate_size, "up": intermediate_size}), bias=False)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size)
        self.kernels = TorchKernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.kernels.silu_and_mul(self.gate_up_proj(x)))
