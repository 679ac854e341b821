"""An fp8 pool's keys and values of some slots, dequantised, in one Triton launch (core/kernels/cuda/fp8_gather_triton.py).

Why: flashinfer's ragged prefill over an fp8 pool reads every sequence back in the model's dtype, once per layer
per prefill chunk; torch does it in ten launches (index_select of values and scales for K and V, a float32 copy,
the multiply, the rounding), moving about six bytes per value where one read and two written suffice. The values
are KVPool.gather's, bit for bit: the same float32 product, rounded once.
"""

from __future__ import annotations

import torch

from core.arith import next_pow2
from core.kvcache.pool import KVPool


def fp8_gather(pool: KVPool, layer: int, slots: torch.Tensor,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``pool.gather(layer, slots, dtype)`` returns for an fp8 pool on CUDA: K and V [n, kv_heads, head_dim]."""
    from core.kernels.cuda.fp8_gather_triton import fp8_gather_kernel

    assert pool.fp8, "the fp8 gather reads fp8 pages"
    k_cache, v_cache = pool.k_layers[layer], pool.v_layers[layer]
    _, heads, dim = k_cache.shape
    slots = slots.contiguous()
    k = torch.empty(slots.shape[0], heads, dim, dtype=dtype, device=k_cache.device)
    v = torch.empty_like(k)
    if slots.shape[0]:
        fp8_gather_kernel[(slots.shape[0], 2)](k_cache, v_cache, pool.k_scale[layer], pool.v_scale[layer], slots,
                                               k, v, HEADS=heads, HEAD_DIM=dim, BLOCK=next_pow2(heads * dim))
    return k, v
