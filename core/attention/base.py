"""What an attention backend does, so the model never knows which kernels run it.

A backend gets the batch once per step (``prepare_metadata``: turn lengths and page-table rows into whatever
its kernels need, shared by every layer) and then, per layer, q/k/v for the batch's new tokens: it writes k
and v into the pool at ``batch.out_loc`` and returns the attention output over each request's whole sequence
(cached prefix plus new tokens).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from core.kvcache.pool import KVPool
from core.request import Batch


class AttentionBackend(ABC):
    def __init__(self, pool: KVPool, page_table: torch.Tensor, num_heads: int, num_kv_heads: int,
                 head_dim: int) -> None:
        self.pool = pool
        self.page_table = page_table
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim ** -0.5

    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None:
        """Fill ``batch.attn_metadata`` for this step."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: Batch) -> torch.Tensor:
        """q: [tokens, heads, dim]; k, v: [tokens, kv_heads, dim]. Returns [tokens, heads, dim]."""
