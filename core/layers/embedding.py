"""Token embedding and the LM head, both split over the vocabulary under tensor parallelism."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from core.arith import ceil_div
from core.attention.context import get_context
from core.distributed.comm import all_gather_last_dim, all_reduce
from core.distributed.info import get_tp_info
from core.kernels.dispatch import TorchKernels
from core.layers.fill import fill


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, dim: int) -> None:
        super().__init__()
        tp = get_tp_info()
        self.vocab_size = vocab_size
        self.part = ceil_div(vocab_size, tp.size)  # ceil: the last rank's slice may be padded
        self.start = tp.rank * self.part
        self.tp_size = tp.size
        self.weight = nn.Parameter(torch.zeros(self.part, dim), requires_grad=False)

    def load(self, tensor: torch.Tensor, shard: str, kind: str) -> None:
        fill(self.weight, tensor[self.start:self.start + self.part])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        mask = (local >= 0) & (local < self.part)
        out = F.embedding(local.clamp(0, self.part - 1), self.weight) * mask.unsqueeze(-1).to(self.weight.dtype)
        return all_reduce(out, self.tp_size)


class HeadScreen(Protocol):
    """A wing's screened head, installed on ``LMHead.screen``: a greedy step's logits with each row's largest (and
    its first index) exact and the rest possibly -inf, for the batches it ``takes``."""

    def takes(self, hidden: torch.Tensor) -> bool: ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


class LMHead(nn.Module):
    """Projects hidden states to logits; shares the embedding's weight when the model ties them."""

    def __init__(self, vocab_size: int, dim: int, tied_to: VocabParallelEmbedding | None) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.tp_size = get_tp_info().size
        self.tied_to = tied_to
        self.packed: torch.Tensor | None = None
        # a greedy step's screened logits (a wing's install call sets it where it runs)
        self.screen: HeadScreen | None = None
        self.kernels = TorchKernels()
        if tied_to is None:
            self.inner = VocabParallelEmbedding(vocab_size, dim)

    @property
    def weight(self) -> torch.Tensor:
        return self.inner.weight if self.tied_to is None else self.tied_to.weight

    def load(self, tensor: torch.Tensor, shard: str, kind: str) -> None:
        if self.tied_to is None:
            self.inner.load(tensor, shard, kind)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.screen is not None and get_context().greedy_logits and self.screen.takes(hidden):
            return self.screen.logits(hidden)[..., : self.vocab_size]
        logits = all_gather_last_dim(self.kernels.linear(hidden, self.weight, None, self.packed), self.tp_size)
        return logits[..., : self.vocab_size]
