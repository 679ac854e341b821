"""Linear layers that take their slice of a full checkpoint tensor while loading, so no rank holds a whole layer.

On one rank they are plain linears. Under tensor parallelism a column-parallel layer keeps a slice of the output
features (whole heads, or a slice of the MLP's intermediate size) and a row-parallel one the matching slice of
the input features, all-reducing its output: one all-reduce per attention block and per MLP.
"""

from __future__ import annotations

import torch
from torch import nn

from core.distributed.comm import all_reduce
from core.distributed.info import get_tp_info
from core.kernels.dispatch import TorchKernels
from core.layers.fill import fill
from core.layers.norm import RMSNorm


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class ColumnParallelLinear(nn.Module):
    """A linear whose output features are split over the ranks, as named blocks: ``blocks`` maps a checkpoint
    shard name ('q', 'k', 'v') to (rows kept on this rank, start row in the full tensor). Loading a shard copies
    those rows into the block's place in the fused weight. Each one sits behind a norm, so it runs only with it."""

    def __init__(self, in_features: int, blocks: dict[str, tuple[int, int]], bias: bool) -> None:
        super().__init__()
        self.blocks = blocks
        self.offsets: dict[str, int] = {}
        offset = 0
        for name, (rows, _) in blocks.items():
            self.offsets[name] = offset
            offset += rows
        self.weight = _param(offset, in_features)
        self.bias = _param(offset) if bias else None
        self.packed: torch.Tensor | None = None  # the weight in oneDNN's layout (core/kernels/cpu/onednn_packed.py)
        self.kernels = TorchKernels()

    def load(self, tensor: torch.Tensor, shard: str, kind: str) -> None:
        rows, start = self.blocks[shard]
        target = self.weight if kind == "weight" else self.bias
        if target is None:
            raise KeyError(f"layer has no {kind}")
        fill(target, tensor[start:start + rows], self.offsets[shard])

    def forward_after_norm(self, x: torch.Tensor, residual: torch.Tensor | None,
                           norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """This linear of ``norm(x + residual)``, and the new residual ``x + residual``: at small batch one kernel."""
        return self.kernels.rms_norm_linear(x, residual, norm.weight, norm.eps, self.weight, self.bias, self.packed)


def column_blocks(sizes: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Split each block's output rows evenly across ranks."""
    tp = get_tp_info()
    out = {}
    for name, size in sizes.items():
        if size % tp.size:
            raise ValueError(f"{name} size {size} is not divisible by tp size {tp.size}")
        part = size // tp.size
        out[name] = (part, tp.rank * part)
    return out


def qkv_blocks(num_heads: int, num_kv_heads: int, head_dim: int) -> dict[str, tuple[int, int]]:
    """q split by heads; k and v split by KV heads, or replicated when there are fewer KV heads than ranks."""
    tp = get_tp_info()
    if num_heads % tp.size:
        raise ValueError(f"{num_heads} attention heads cannot be split over {tp.size} ranks")
    q_heads = num_heads // tp.size
    kv_heads, kv_start = local_kv_heads(num_kv_heads)
    return {
        "q": (q_heads * head_dim, tp.rank * q_heads * head_dim),
        "k": (kv_heads * head_dim, kv_start * head_dim),
        "v": (kv_heads * head_dim, kv_start * head_dim),
    }


def local_kv_heads(num_kv_heads: int) -> tuple[int, int]:
    """(KV heads on this rank, first KV head index in the checkpoint)."""
    tp = get_tp_info()
    if num_kv_heads >= tp.size:
        if num_kv_heads % tp.size:
            raise ValueError(f"{num_kv_heads} KV heads cannot be split over {tp.size} ranks")
        per_rank = num_kv_heads // tp.size
        return per_rank, tp.rank * per_rank
    if tp.size % num_kv_heads:
        raise ValueError(f"tp size {tp.size} is not a multiple of the {num_kv_heads} KV heads")
    return 1, tp.rank * num_kv_heads // tp.size


class RowParallelLinear(nn.Module):
    """Keeps a slice of the input features; the partial products are summed across ranks."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        tp = get_tp_info()
        if in_features % tp.size:
            raise ValueError(f"input size {in_features} is not divisible by tp size {tp.size}")
        self.tp_size = tp.size
        self.part = in_features // tp.size
        self.start = tp.rank * self.part
        self.weight = _param(out_features, self.part)
        self.packed: torch.Tensor | None = None
        self.kernels = TorchKernels()

    def load(self, tensor: torch.Tensor, shard: str, kind: str) -> None:
        if kind != "weight":
            raise KeyError(f"row-parallel layer has no {kind}")
        fill(self.weight, tensor[:, self.start:self.start + self.part])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """On one rank the output goes into the add+RMSNorm after this layer, which may sum a split-K linear's
        slices itself (``summed_later``); across ranks the all-reduce needs it whole."""
        out = self.kernels.linear(x, self.weight, None, self.packed, summed_later=self.tp_size == 1)
        return all_reduce(out, self.tp_size)

    def forward_after_silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``self(silu(gate) * up)`` for a gate_up projection's output: at small batch one kernel."""
        out = self.kernels.silu_mul_linear(gate_up, self.weight, self.packed, summed_later=self.tp_size == 1)
        return all_reduce(out, self.tp_size)
