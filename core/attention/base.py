"""What an attention backend does, so the model never knows which kernels run it.

A backend gets the batch once per step (``prepare_metadata``: turn lengths and page-table rows into whatever
its kernels need, shared by every layer) and then, per layer, q/k/v for the batch's new tokens (``forward``):
it writes k and v into the pool at ``batch.out_loc`` and returns the attention output over each request's whole
sequence (cached prefix plus new tokens).

Kernels that plan ahead (flashinfer) do so in ``begin_forward``, which the engine calls right before the
forward pass rather than when the batch is prepared: planning writes buffers that the previous step's kernels
may still read, so it belongs on the forward path. A backend that can run decode under CUDA graphs keeps its
metadata in fixed buffers, allocated once (``init_cuda_graph``; ``init_prefill_graph`` for the prefill
chunks' graphs) and filled by ``begin_forward(batch, graph=True)`` before each capture and replay.

A backend may also take a layer's batch straight from the QKV projection's output (``attend_qkv``): where the
engine's plan fuses the QKV path it must (a fused kernel normalises, rotates and writes k and v into the pool,
and the backend attends over the pool); elsewhere it may, or leave those steps to the layer and take ``forward``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from core.kvcache.pool import KVPool
from core.request import Batch


@dataclass(frozen=True)
class QKVSpec:
    """What turns one layer's QKV projection output into attention's inputs."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    cos_sin: torch.Tensor  # [positions, head_dim]: cos for the first half, sin for the second
    q_norm_weight: torch.Tensor | None  # per-head RMSNorm gains (Qwen3), or None
    k_norm_weight: torch.Tensor | None
    eps: float


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

    def begin_forward(self, batch: Batch, graph: bool = False) -> None:
        """Last step before the forward pass: plan kernels from ``batch.attn_metadata``. ``graph``: the pass is a
        captured graph's (its capture or a replay): fill that graph's fixed buffers instead, a decode graph's for
        ``batch.padded_size`` rows (padding rows after the batch's requests) or the prefill graph's for
        ``batch.padded_size`` requests (none during capture), and set ``batch.attn_metadata`` to what the layers
        read during capture and replay."""
        if graph:
            raise NotImplementedError(f"{type(self).__name__} cannot run under CUDA graphs")

    supports_cuda_graph = False

    def init_cuda_graph(self, batch_sizes: list[int], dummy_page: int) -> None:
        """Allocate fixed metadata buffers for decode batches of these sizes; padding rows read ``dummy_page``."""
        raise NotImplementedError(f"{type(self).__name__} cannot run under CUDA graphs")

    def init_prefill_graph(self, max_reqs: int, tokens: int, dummy_page: int) -> None:
        """Allocate fixed metadata buffers for a prefill chunk of ``tokens`` tokens from at most ``max_reqs``
        requests; padding requests read ``dummy_page``."""
        raise NotImplementedError(f"{type(self).__name__} cannot run a prefill under a CUDA graph")

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: Batch) -> torch.Tensor:
        """q: [tokens, heads, dim]; k, v: [tokens, kv_heads, dim]. Returns [tokens, heads, dim]."""

    def attend_qkv(self, qkv: torch.Tensor, positions: torch.Tensor, spec: QKVSpec, layer: int, batch: Batch,
                   fused: bool) -> torch.Tensor | None:
        """Attention straight from the QKV projection's output: QK-norm, RoPE, the KV write and attention, as
        [tokens, heads, dim]. ``fused``: the engine's plan fused the QKV path (only with a backend whose kernels
        read every key and value from the pool, core/engine/plan.py), and the backend must take the batch.
        Otherwise it may (a kernel of its own for some batches), or return None (this default): the layer then
        does those steps itself and calls ``forward``."""
        if fused:
            raise NotImplementedError(f"{type(self).__name__} has no fused QKV path")
        return None
