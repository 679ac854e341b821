"""How many pages the KV pool gets: as asked, or what a budget of memory holds, never more than every request row
filled to the longest sequence."""

from __future__ import annotations

import torch

from core.arith import pages_for
from core.config import EngineConfig
from core.distributed.comm import min_over_ranks
from core.errors import InvalidParamsError
from core.words import plural

DEFAULT_CPU_KV_GB = 1.0
GPU_HEADROOM_FRACTION = 0.1  # of the memory free after loading the weights, kept out of the KV pool
GPU_MIN_HEADROOM_GB = 4.0


def pool_pages(config: EngineConfig, per_token: int, page_size: int, max_seq_len: int, tp_size: int,
               device: torch.device) -> int:
    """The pool's pages for ``per_token`` bytes a cached token (the same on every rank: the smallest count)."""
    if config.num_pages is not None:
        return config.num_pages
    budget_gb = config.kv_cache_gb or default_kv_gb(device)
    pages = int(budget_gb * (1 << 30)) // (per_token * page_size)
    # no need for more than every row filled to the longest sequence
    needed = config.max_running_req * pages_for(max_seq_len, page_size)
    pages = min_over_ranks(min(pages, needed), tp_size, device)  # free memory differs per GPU
    if pages < config.max_running_req:
        raise InvalidParamsError(f"a KV budget of {budget_gb} GiB gives only {plural(pages, 'page')}; it needs at least "
                                 f"{config.max_running_req} (one per request row)")
    return pages


def default_kv_gb(device: torch.device) -> float:
    """On CUDA: a fraction of the memory still free once the weights are loaded. The rest is headroom for
    activations (a prefill of max_extend_tokens), the logits and sampling of a full batch, flashinfer's
    workspaces and the CUDA graphs' memory pool: a few GiB for a small model."""
    if device.type != "cuda":
        return DEFAULT_CPU_KV_GB
    free, _ = torch.cuda.mem_get_info(device)
    headroom = max(GPU_HEADROOM_FRACTION * free, GPU_MIN_HEADROOM_GB * (1 << 30))
    return max(free - headroom, 0) / (1 << 30)
