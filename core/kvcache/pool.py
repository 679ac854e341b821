"""The KV pool: per layer, one K and one V buffer of ``num_pages * page_size`` token slots.

A slot index is ``page * page_size + offset``. The page table maps (request row, position) to a slot; the pool
itself knows nothing about requests. The flat [slots, kv_heads, head_dim] layout views directly as
[pages, page_size, kv_heads, head_dim], which is what paged kernels expect.

With ``fp8`` the pool stores float8 e4m3 values and one float32 scale per (slot, KV head): each head's vector
is divided by its largest magnitude over 448 (e4m3's largest finite value) when written, so no value saturates
and every head keeps e4m3's ~2 significant digits whatever its range. That halves the bytes a decode step
reads against bf16 (plus 4 bytes of scale per 128 values at head dim 128). Readers multiply the scale back.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0


class KVPool:
    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, fp8: bool = False) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_slots = num_pages * page_size
        self.dtype = dtype  # what readers get back (the model's dtype)
        self.fp8 = fp8
        shape = (num_layers, self.num_slots, num_kv_heads, head_dim)
        store = FP8_DTYPE if fp8 else dtype
        self.k = torch.zeros(shape, dtype=store, device=device)
        self.v = torch.zeros(shape, dtype=store, device=device)
        # fp8: per (layer, slot, KV head) scales; ones, so an unwritten slot reads as zeros like a bf16 pool
        # each layer's [slots, kv_heads, head_dim] view, made once: indexing ``self.k[layer]`` is a kernel call
        self.k_layers, self.v_layers = self.k.unbind(0), self.v.unbind(0)
        self.k_scale = torch.ones(shape[:3], dtype=torch.float32, device=device) if fp8 else None
        self.v_scale = torch.ones(shape[:3], dtype=torch.float32, device=device) if fp8 else None

    def store(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if not self.fp8:  # index_copy_: what ``cache[loc] = k`` does, with less dispatch around it
            self.k_layers[layer].index_copy_(0, loc, k)
            self.v_layers[layer].index_copy_(0, loc, v)
            return
        for cache, scales, x in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            values, scale = quantize_fp8(x)
            cache[layer][loc] = values
            scales[layer][loc] = scale

    def gather(self, layer: int, slots: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``slots`` ([n] slot indices) as [n, kv_heads, head_dim] in ``dtype``."""
        k = self.k_layers[layer].index_select(0, slots)
        v = self.v_layers[layer].index_select(0, slots)
        if not self.fp8:
            return (k, v) if k.dtype == dtype else (k.to(dtype), v.to(dtype))
        k_scale = self.k_scale[layer].index_select(0, slots)
        v_scale = self.v_scale[layer].index_select(0, slots)
        return dequantize_fp8(k, k_scale, dtype), dequantize_fp8(v, v_scale, dtype)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                        fp8: bool = False) -> int:
        if fp8:  # one byte per value and a float32 scale per head, for K and for V
            return 2 * num_layers * num_kv_heads * (head_dim + 4)
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [tokens, heads, dim] -> (e4m3 values, float32 scales [tokens, heads]) with x ~ values * scale."""
    x32 = x.float()
    scale = (x32.abs().amax(dim=-1) / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    return (x32 / scale[..., None]).to(FP8_DTYPE), scale


def dequantize_fp8(values: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (values.float() * scale[..., None]).to(dtype)
