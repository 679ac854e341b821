"""Decode attention for a batch on a CPU as one C call (``decode_attention`` in core/kernels/cpu/decode.c), or
straight from the QKV projection's output with QK-norm, RoPE and the KV write in the same call (``from_qkv``).

The torch backend's decode gathers every request's cached keys and values into one padded [batch, max_len]
block and runs a masked SDPA over it: a large share of a batched CPU decode step went to that copy and the
padding (docs/BENCHMARKS.md). The C call reads each request's key and
value rows in place in the pool, once for all its query heads, with no padding and no mask. Its sums run in
another order than SDPA's (close, not bit-identical, like the C decode step's), and the tokens are checked against
transformers like the rest.

Used by the torch backend for decode steps on a float32 pool of a CPU engine where the C library builds (the
plan's ``c_attention``, core/engine/plan.py); ``MINISGL_DISABLE_CPU_DECODE=1`` keeps SDPA.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from core.kernels.c_build import address
from core.attention.base import QKVSpec


@dataclass(frozen=True)
class AttentionRows:
    """What each row of ``CDecodeAttention.from_qkv`` attends over: slot lists of ``max_len`` entries, row-major
    ([lists * max_len] int64); row b reads list ``row_seq[b]`` (list b when ``row_seq`` is None) up to ``lens[b]``
    ([rows] int64). A decode step's rows are its requests, one list each; a prefill's rows are its tokens, each
    over its sequence's list up to its own position."""

    slots: torch.Tensor
    max_len: int
    lens: torch.Tensor
    row_seq: torch.Tensor | None = None


@dataclass(frozen=True)
class CDecodeAttention:
    """The loaded library, the threads it runs on (torch's, read when the engine is built) and whether the CPU has
    AVX-512 (the weighted values then take its wider registers)."""

    library: ctypes.CDLL
    threads: int
    avx512: bool = False

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                 lens: torch.Tensor, scale: float) -> torch.Tensor:
        """q [batch, heads, dim] float32; a layer's k and v pools [slots, kv_heads, dim]; slots [batch * max_len]
        int64 (row-major, each row's first lens[b] entries read); returns [batch, heads, dim]."""
        q = q.contiguous()
        batch, heads, dim = q.shape
        out = torch.empty_like(q)
        self.library.decode_attention(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(),
                                      lens.data_ptr(), batch, slots.numel() // batch, heads, k_cache.shape[1], dim,
                                      scale, out.data_ptr(), self.threads, int(self.avx512))
        return out

    def from_qkv(self, qkv: torch.Tensor, positions: torch.Tensor, spec: QKVSpec, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, out_loc: torch.Tensor, rows: AttentionRows, scale: float) -> torch.Tensor:
        """The same from qkv [rows, (heads + 2 kv_heads) * dim] float32 (q, k, v as the QKV projection lays them
        out): QK-norm where the spec has it, RoPE at positions [rows] int64, the new k and v written to the pools
        at out_loc [rows] int64, then attention over what ``rows`` names; returns [rows, heads, dim]. One call
        where torch ran a split, a rotation and two index copies."""
        qkv = qkv.contiguous()
        count, heads, dim = qkv.shape[0], spec.num_heads, spec.head_dim
        q, out = torch.empty(count, heads, dim), torch.empty(count, heads, dim)
        indices = [None if t is None else address(t.contiguous(), torch.int64)
                   for t in (positions, out_loc, rows.slots, rows.lens, rows.row_seq)]
        self.library.attend_from_qkv(
            qkv.data_ptr(), indices[0], address(spec.cos_sin), address(spec.q_norm_weight),
            address(spec.k_norm_weight), spec.eps, k_cache.data_ptr(), v_cache.data_ptr(), *indices[1:], count,
            rows.max_len, heads, spec.num_kv_heads, dim, scale, q.data_ptr(), out.data_ptr(), self.threads,
            int(self.avx512))
        return out
