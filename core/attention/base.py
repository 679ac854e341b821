"""What an attention backend does, so the model never knows which kernels run it.

A backend gets the batch once per step (``prepare_metadata``: turn lengths and page-table rows into whatever
its kernels need, shared by every layer) and then, per layer, q/k/v for the batch's new tokens: it writes k
and v into the pool at ``batch.out_loc`` and returns the attention output over each request's whole sequence
(cached prefix plus new tokens).

Kernels that plan ahead (flashinfer) do so in ``begin_forward``, which the engine calls right before the
forward pass rather than when the batch is prepared: planning writes buffers that the previous step's kernels
may still read, so it belongs on the forward path. A backend that can run decode under CUDA graphs keeps its
metadata in fixed buffers, one set per captured batch size (``init_cuda_graph`` / ``plan_cuda_graph``); one that
can also run a full prefill chunk under a graph keeps one more set for it (``init_prefill_graph`` /
``plan_prefill_graph``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from core.kvcache.pool import KVPool
from core.kernels.fused_qkv import QKVSpec, qkv_norm_rope_store
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

    def begin_forward(self, batch: Batch) -> None:
        """Last step before the forward pass (eager): plan kernels from ``batch.attn_metadata``."""

    supports_cuda_graph = False

    def init_cuda_graph(self, batch_sizes: list[int], dummy_page: int) -> None:
        """Allocate fixed metadata buffers for decode batches of these sizes; padding rows read ``dummy_page``."""
        raise NotImplementedError(f"{type(self).__name__} cannot run under CUDA graphs")

    def plan_cuda_graph(self, batch: Batch, padded_size: int) -> None:
        """Fill the fixed buffers of ``padded_size`` for ``batch`` (padding rows after its requests) and set
        ``batch.attn_metadata`` to what ``forward`` reads during capture and replay."""
        raise NotImplementedError(f"{type(self).__name__} cannot run under CUDA graphs")

    def init_prefill_graph(self, max_reqs: int, tokens: int, dummy_page: int) -> None:
        """Allocate fixed metadata buffers for a prefill chunk of ``tokens`` tokens from at most ``max_reqs``
        requests; padding requests read ``dummy_page``."""
        raise NotImplementedError(f"{type(self).__name__} cannot run a prefill under a CUDA graph")

    def plan_prefill_graph(self, batch: Batch) -> None:
        """Fill the prefill graph's buffers for ``batch`` (prepared with ``padded_size`` requests; none during
        capture) and set ``batch.attn_metadata`` to what ``forward`` reads during capture and replay."""
        raise NotImplementedError(f"{type(self).__name__} cannot run a prefill under a CUDA graph")

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: Batch) -> torch.Tensor:
        """q: [tokens, heads, dim]; k, v: [tokens, kv_heads, dim]. Returns [tokens, heads, dim]."""

    # A backend whose kernels read every key and value from the pool can take them already written there (by a
    # fused kernel that also normalised and rotated them): when the engine's plan fuses the QKV path (only with
    # such a backend, core/engine/plan.py) the layers call ``attend_qkv`` instead of ``forward``.

    def attend_from_qkv(self, qkv: torch.Tensor, positions: torch.Tensor, spec: QKVSpec, layer: int,
                        batch: Batch) -> torch.Tensor | None:
        """On the unfused path, a backend may still take a batch straight from the QKV projection's output
        (QK-norm, RoPE, the KV write and attention in one call of its own) and return [tokens, heads, dim]; None
        (this default) means the layer does those itself, then calls ``forward``."""
        return None

    def attend(self, q: torch.Tensor, layer: int, batch: Batch) -> torch.Tensor:
        """Attention for a contiguous q once this step's k and v are in the pool at ``batch.out_loc``."""
        raise NotImplementedError(f"{type(self).__name__} needs k and v passed to forward")

    def attend_qkv(self, qkv: torch.Tensor, positions: torch.Tensor, spec: QKVSpec, layer: int,
                   batch: Batch) -> torch.Tensor:
        """Attention straight from the QKV projection's output: QK-norm, RoPE and the KV write in one fused
        kernel (core/kernels/fused_qkv.py), then ``attend``. A backend may fuse further for some batches."""
        pool = self.pool
        scales = (pool.k_scale[layer], pool.v_scale[layer]) if pool.fp8 else (None, None)  # fp8: quantised in
        q = qkv_norm_rope_store(qkv, spec.num_heads, spec.num_kv_heads, spec.head_dim, positions, spec.cos_sin,
                                spec.q_norm_weight, spec.k_norm_weight, spec.eps, pool.k_layers[layer],
                                pool.v_layers[layer], batch.out_loc, *scales, head_block=pool.head_block)
        return self.attend(q, layer, batch)
