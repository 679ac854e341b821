"""Decode attention for a batch on a CPU as one C call (``decode_attention`` in core/kernels/cpu_decode.c).

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
