"""Collectives the tensor-parallel layers and the engine need, on the default process group; no-ops on one rank.
Each caller passes the tensor-parallel size it was built with, so a layer never asks a global whether to
communicate."""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor, size: int) -> torch.Tensor:
    """Sum ``x`` in place over the ranks (the row-parallel layers' partial products)."""
    if size > 1:
        dist.all_reduce(x)
    return x


def all_gather_last_dim(x: torch.Tensor, size: int) -> torch.Tensor:
    """Concatenate each rank's slice along the last dimension (vocab-parallel logits)."""
    if size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def broadcast_from_primary(x: torch.Tensor, size: int) -> torch.Tensor:
    """Overwrite ``x`` with rank 0's copy, so every rank feeds back exactly the tokens rank 0 reports."""
    if size > 1:
        dist.broadcast(x, src=0)
    return x


def min_over_ranks(value: int, size: int, device: torch.device) -> int:
    """The smallest of each rank's ``value`` (e.g. KV pages: every rank must schedule with the same pool)."""
    if size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())
