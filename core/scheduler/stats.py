"""What the scheduler reports about itself when asked (``LLM.stats``): rows and KV pages now, the prefix cache's
hit rate and the preemptions so far."""

from __future__ import annotations

from core.scheduler.cache import CacheManager
from core.scheduler.prefill import PrefillManager
from core.scheduler.table import TableManager


def scheduler_stats(table: TableManager, cache: CacheManager, prefill: PrefillManager,
                    preemptions: int) -> dict[str, int | float]:
    return {
        "free_rows": table.available,
        "total_rows": table.total_rows,
        "free_pages": cache.free_pages,
        "cached_pages": cache.cached_pages,
        "total_pages": cache.num_pages,
        "evicted_pages": cache.evicted_pages,
        "prompt_tokens": prefill.prompt_tokens,
        "cached_prompt_tokens": prefill.cached_prompt_tokens,
        "hit_rate": prefill.cached_prompt_tokens / prefill.prompt_tokens if prefill.prompt_tokens else 0.0,
        "preemptions": preemptions,
    }
