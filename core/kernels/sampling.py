"""What the sampler (core/engine/sampler.py) and a wing that runs its race share, below both: the counter-based
hash its noise comes from, and the kernels a wing may hand the sampler for its race and its greedy pick.

The hash is integer tensor ops on int64 (every product stays below 2**62), so the sampler's torch race and a
wing's kernel (which takes the products modulo 2**32; their low 31 bits are the same) draw the same noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

MASK31 = 0x7FFFFFFF
MIX_MULTIPLIER = 0x45D9F3B
COLUMN_MULTIPLIER = 0x27D4EB2D


def mix(x: torch.Tensor) -> torch.Tensor:
    """A 31-bit integer hash (products stay below 2**62, so int64 never overflows)."""
    x = ((x ^ (x >> 16)) * MIX_MULTIPLIER) & MASK31
    x = ((x ^ (x >> 16)) * MIX_MULTIPLIER) & MASK31
    return x ^ (x >> 16)


def row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Each row's key, [rows] int64 below 2**31: its seed mixed thoroughly, then its position."""
    seeds = seeds.to(torch.int64)
    return mix(mix((seeds ^ (seeds >> 31)) & MASK31) ^ (positions.to(torch.int64) & MASK31))


@dataclass(frozen=True)
class SamplingKernels:
    """A wing's kernels in place of the sampler's torch race and argmax, with the same tokens. ``race`` takes
    (logits, temperatures, seeds, positions); ``greedy`` the logits; ``warm_rows``: the row counts whose compiled
    code differs, compiled when the engine starts rather than in a step. ``reads_masks``: both also take ``bits``,
    a grammar's token masks for every row, and draw what they would from the masked logits, without the masked
    copy of the logits that the sampler otherwise makes."""

    race: Callable[..., torch.Tensor]
    greedy: Callable[..., torch.Tensor]
    warm_rows: tuple[int, ...] = (1, 2)
    reads_masks: bool = False
