"""The background threads of structured output, one per kind of work, each made at first use."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import cache


@cache
def single_worker(name: str) -> ThreadPoolExecutor:
    """The one thread named ``name`` (its jobs never run two at once), made the first time it is asked for: an
    engine that never sees a constrained request never starts it."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
