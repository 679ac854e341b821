"""Decode attention for a batch on a CPU as one C call (``decode_attention`` in core/kernels/cpu_decode.c), or
straight from the QKV projection's output with QK-norm, RoPE and the KV write in the same call (``from_qkv``).

The torch backend's decode gathers every request's cached keys and values into one padded [batch, max_len]
block and runs a masked SDPA over it: on a 2-vCPU Xeon, for the ``cpu`` workload's 32-request decode steps,
the gather and SDPA took about 28 ms of a 99 ms step (the linears 58). The C call reads each request's key and
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

from core.kernels.c_build import float32_address
from core.kernels.fused_qkv import QKVSpec


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
                 v_cache: torch.Tensor, out_loc: torch.Tensor, slots: torch.Tensor, max_len: int, lens: torch.Tensor,
                 scale: float, row_seq: torch.Tensor | None = None) -> torch.Tensor:
        """The same from qkv [rows, (heads + 2 kv_heads) * dim] float32 (q, k, v as the QKV projection lays them
        out): QK-norm where the spec has it, RoPE at positions [rows] int64, the new k and v written to the pools
        at out_loc [rows] int64, then attention; returns [rows, heads, dim]. One call where torch ran a split,
        a rotation and two index copies. slots: slot lists of max_len entries, row-major; row b reads list
        row_seq[b] (list b without row_seq) up to lens[b]: a prefill's tokens are rows over their sequence's list,
        each up to its own position."""
        qkv = qkv.contiguous()
        rows, heads, dim = qkv.shape[0], spec.num_heads, spec.head_dim
        positions, out_loc, slots, lens = (_int64(t) for t in (positions, out_loc, slots, lens))
        q, out = torch.empty(rows, heads, dim), torch.empty(rows, heads, dim)
        self.library.attend_from_qkv(
            qkv.data_ptr(), positions.data_ptr(), float32_address(spec.cos_sin), float32_address(spec.q_norm_weight),
            float32_address(spec.k_norm_weight), spec.eps, k_cache.data_ptr(), v_cache.data_ptr(), out_loc.data_ptr(),
            slots.data_ptr(), lens.data_ptr(), None if row_seq is None else _int64(row_seq).data_ptr(), rows, max_len,
            heads, spec.num_kv_heads, dim, scale, q.data_ptr(), out.data_ptr(), self.threads, int(self.avx512))
        return out


def _int64(t: torch.Tensor) -> torch.Tensor:
    """An index vector as the C code reads it: contiguous int64."""
    if t.dtype != torch.int64:
        raise ValueError(f"the C attention reads int64 indices, got {t.dtype}")
    return t.contiguous()
