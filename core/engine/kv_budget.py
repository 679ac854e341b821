"""How many pages the KV pool gets: as asked, or what a budget of memory holds, never more than every request row
filled to the longest sequence.

On CUDA the budget is planned once, for everything on the card: the weights and what the load derives from them
(fused blocks) are already there when the memory free is read; what the wings install after the pool (the LM
head's screen, the graphs' buffers, workspaces) is counted from the plan and set aside; a reserve is kept for
what passes through a step (a full chunk's activations, the sampler's float32 logits) and the allocator's slack;
the pool gets the rest. So a model that fits the card starts on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.arith import pages_for
from core.config import EngineConfig
from core.distributed.comm import min_over_ranks
from core.errors import InvalidParamsError
from core.words import plural

DEFAULT_CPU_KV_GB = 1.0
GPU_HEADROOM_FRACTION = 0.1  # of the memory free after loading the weights, kept out of the KV pool
GPU_MIN_HEADROOM_GB = 4.0
GIB = 1 << 30


@dataclass(frozen=True)
class MemoryPlan:
    """A card's memory once the weights are loaded, in bytes: what is free, what the wings will keep after the
    pool (``counted``), the reserve, and the pool's share, the rest."""

    free: int
    counted: int
    reserve: int

    @property
    def kv_bytes(self) -> int:
        return max(self.free - self.counted - self.reserve, 0)


def plan_memory(free: int, counted: int) -> MemoryPlan:
    """The reserve: a tenth of the free memory, at least GPU_MIN_HEADROOM_GB."""
    return MemoryPlan(free, counted, max(int(GPU_HEADROOM_FRACTION * free), int(GPU_MIN_HEADROOM_GB * GIB)))


def device_memory_plan(device: torch.device, counted: int) -> MemoryPlan | None:
    """The plan for a CUDA device from its free memory now (None elsewhere: a CPU's pool has a fixed budget)."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return plan_memory(free, counted)


def pool_pages(config: EngineConfig, per_token: int, page_size: int, max_seq_len: int, tp_size: int,
               device: torch.device, memory: MemoryPlan | None = None) -> int:
    """The pool's pages for ``per_token`` bytes a cached token (the same on every rank: the smallest count):
    ``config.num_pages``, else what ``config.kv_cache_gb`` holds, else what ``memory`` leaves it (on a CPU,
    DEFAULT_CPU_KV_GB)."""
    if config.num_pages is not None:
        return config.num_pages
    budget_gb = kv_budget_gb(config, memory)
    pages = int(budget_gb * GIB) // (per_token * page_size)
    # no need for more than every row filled to the longest sequence
    needed = config.max_running_req * pages_for(max_seq_len, page_size)
    pages = min_over_ranks(min(pages, needed), tp_size, device)  # free memory differs per GPU
    if pages < config.max_running_req:
        raise InvalidParamsError(f"a KV budget of {budget_gb:.3g} GiB gives only {plural(pages, 'page')}; it needs "
                                 f"at least {config.max_running_req} (one per request row)")
    return pages


def kv_budget_gb(config: EngineConfig, memory: MemoryPlan | None) -> float:
    """The GiB the pool may take: as asked, else the memory plan's share, else a CPU's default."""
    if config.kv_cache_gb:
        return config.kv_cache_gb
    return memory.kv_bytes / GIB if memory is not None else DEFAULT_CPU_KV_GB
