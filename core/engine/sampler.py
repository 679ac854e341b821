"""Turning logits into next tokens, per request: greedy, temperature, top-k, top-p, seeded.

Random choices use the exponential-race trick: ``argmax(p / E)`` with ``E ~ Exp(1)`` draws from ``p``. The
noise comes from a counter-based hash of (request seed, token position, vocabulary index) computed with
integer tensor ops, so a request's draw depends only on its own seed and position: the same seed gives the
same tokens alone or in any batch, on any device, with no per-request generator objects and no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.request import Batch

_MASK31 = 0x7FFFFFFF


@dataclass
class SampleArgs:
    """Per-row sampling parameters on the device; ``None`` when every row is greedy (the fast path)."""

    temperatures: torch.Tensor | None = None
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    seeds: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    greedy_rows: torch.Tensor | None = None

    @property
    def all_greedy(self) -> bool:
        return self.temperatures is None


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 31-bit integer hash (products stay below 2**62, so int64 never overflows)."""
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _MASK31
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _MASK31
    return x ^ (x >> 16)


def hashed_uniform(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, vocab] uniforms in (0, 1), a pure function of (seed, position, column)."""
    seeds = seeds.to(torch.int64)
    key = _mix(_mix((seeds ^ (seeds >> 31)) & _MASK31) ^ (positions.to(torch.int64) & _MASK31))
    cols = (torch.arange(vocab, device=seeds.device, dtype=torch.int64) * 0x27D4EB2D) & _MASK31
    bits = _mix(_mix((key[:, None] ^ cols[None, :]) & _MASK31))
    return (bits.to(torch.float64) + 0.5).div_(2.0 ** 31).to(torch.float32)


class Sampler:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def prepare(self, batch: Batch) -> SampleArgs:
        params = [r.params for r in batch.reqs]
        if all(p.greedy for p in params):
            return SampleArgs()

        def tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

        return SampleArgs(
            temperatures=tensor([max(p.temperature, 1e-5) for p in params], torch.float32),
            top_k=tensor([p.top_k for p in params], torch.int64),
            top_p=tensor([p.top_p for p in params], torch.float32),
            seeds=tensor([r.sample_seed for r in batch.reqs], torch.int64),
            positions=tensor([r.device_len for r in batch.reqs], torch.int64),
            greedy_rows=tensor([p.greedy for p in params], torch.bool),
        )

    def sample(self, logits: torch.Tensor, args: SampleArgs) -> torch.Tensor:
        greedy = logits.argmax(dim=-1)
        if args.all_greedy:
            return greedy.to(torch.int32)
        probs = torch.softmax(logits / args.temperatures[:, None], dim=-1)
        probs = _top_k_top_p(probs, args.top_k, args.top_p)
        noise = hashed_uniform(args.seeds, args.positions, logits.shape[-1])
        sampled = (probs / -torch.log(noise)).argmax(dim=-1)
        return torch.where(args.greedy_rows, greedy, sampled).to(torch.int32)


def _top_k_top_p(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero the tokens outside each row's top-k and nucleus; the most likely token always survives."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    vocab = probs.shape[-1]
    rank = torch.arange(vocab, device=probs.device)[None, :]
    k = torch.where(top_k < 0, torch.full_like(top_k, vocab), top_k)
    keep = rank < k[:, None]
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly above each token
    keep &= before < top_p[:, None]
    keep[:, 0] = True
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs * keep)
    return kept
