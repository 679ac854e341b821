"""The KV pool: per layer, one K and one V buffer of ``num_pages * page_size`` token slots.

A slot index is ``page * page_size + offset``; the page table maps (request row, position) to a slot, and the
pool knows nothing about requests. Two layouts, in flashinfer's names:

* NHD (the default): token-major, [slots, kv_heads, head_dim], viewed as [pages, page_size, kv_heads,
  head_dim]. A slot is one row: what the CPU kernels and the fp8 ones read.
* HND (``head_major``): [pages, kv_heads, page_size, head_dim]. A decode kernel reads one KV head of a request
  at a time, so a page is one contiguous run of ``page_size * head_dim`` values, not ``page_size`` strided rows:
  fewer, longer reads, which flashinfer's decode takes faster at large pages (docs/BENCHMARKS.md).

NHD is HND with one token per head block, so kernels address both with one formula: a token's head starts at
``(slot // head_block) * kv_heads * head_block * head_dim + head * head_block * head_dim + (slot % head_block) *
head_dim``, ``head_block`` being 1 (NHD) or ``page_size`` (HND).

With ``fp8`` the pool stores float8 e4m3 values and one float32 scale per (slot, KV head): each head's vector is
divided by its largest magnitude over 448 (e4m3's largest finite value) when written, so no value saturates and
every head keeps e4m3's ~2 significant digits whatever its range, in half the bytes of bf16. Readers multiply
the scale back.
"""

from __future__ import annotations

import math

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0

CPU_ALIGN = 64  # bytes: a cache line, the widest vector the C kernels load


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros. On a CPU from calloc (numpy's zeros), whose large blocks the kernel maps as zero pages on first write:
    a pool sized for the longest contexts costs, at start and in resident memory, only the pages requests fill,
    where torch.zeros writes every byte of it first."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    import numpy as np

    nbytes = math.prod(shape) * dtype.itemsize
    raw = torch.from_numpy(np.zeros(nbytes + CPU_ALIGN, dtype=np.uint8))
    start = -raw.data_ptr() % CPU_ALIGN
    return raw[start:start + nbytes].view(dtype).view(shape)


class KVPool:
    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, fp8: bool = False, head_major: bool = False) -> None:
        if fp8 and head_major:
            raise ValueError("an fp8 pool is token-major: its kernels read a slot's heads and scales as one row")
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_slots = num_pages * page_size
        self.dtype = dtype  # what readers get back (the model's dtype)
        self.fp8 = fp8
        self.layout = "HND" if head_major else "NHD"
        self.head_block = page_size if head_major else 1  # tokens of one KV head stored side by side
        shape = ((num_layers, num_pages, num_kv_heads, page_size, head_dim) if head_major
                 else (num_layers, self.num_slots, num_kv_heads, head_dim))
        store = FP8_DTYPE if fp8 else dtype
        self.k = lazy_zeros(shape, store, device)
        self.v = lazy_zeros(shape, store, device)
        # each layer's buffer in the pool's layout, made once: indexing ``self.k[layer]`` is a kernel call
        self.k_layers, self.v_layers = self.k.unbind(0), self.v.unbind(0)
        # fp8: per (layer, slot, KV head) scales; ones, so an unwritten slot reads as zeros like a bf16 pool
        self.k_scale = torch.ones(shape[:3], dtype=torch.float32, device=device) if fp8 else None
        self.v_scale = torch.ones(shape[:3], dtype=torch.float32, device=device) if fp8 else None

    @property
    def head_major(self) -> bool:
        return self.layout == "HND"

    def pages(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's K and V as paged kernels take them in this pool's ``layout``: [pages, page_size, kv_heads,
        head_dim] (NHD) or [pages, kv_heads, page_size, head_dim] (HND)."""
        k, v = self.k_layers[layer], self.v_layers[layer]
        if self.head_major:
            return k, v
        shape = (-1, self.page_size) + tuple(k.shape[1:])
        return k.view(shape), v.view(shape)

    def _page_and_offset(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Where ``slots`` sit in a head-major layer seen token-major (``.transpose(1, 2)``: [pages, page_size,
        kv_heads, head_dim], strided): indexing that view with these names their [n, kv_heads, head_dim]."""
        return slots // self.page_size, slots % self.page_size

    def store(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.head_major:
            index = self._page_and_offset(loc)
            self.k_layers[layer].transpose(1, 2)[index] = k
            self.v_layers[layer].transpose(1, 2)[index] = v
            return
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
        if self.head_major:
            index = self._page_and_offset(slots)
            k, v = self.k_layers[layer].transpose(1, 2)[index], self.v_layers[layer].transpose(1, 2)[index]
        else:
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
