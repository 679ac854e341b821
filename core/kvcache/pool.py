"""The KV pool: per layer, one K and one V buffer of ``num_pages * page_size`` token slots.

A slot index is ``page * page_size + offset``. The page table maps (request row, position) to a slot; the pool
itself knows nothing about requests. The flat [slots, kv_heads, head_dim] layout views directly as
[pages, page_size, kv_heads, head_dim], which is what paged kernels expect.
"""

from __future__ import annotations

import torch


class KVPool:
    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_slots = num_pages * page_size
        shape = (num_layers, self.num_slots, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def store(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer][loc] = k
        self.v[layer][loc] = v

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
