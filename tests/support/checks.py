"""Checks shared by the scheduling tests: memoised reference tokens and the KV page audit."""

from __future__ import annotations

from core import LLM
from tests.support.reference import hf_greedy

_REFERENCE: dict[tuple[str, tuple[int, ...]], list[int]] = {}


def greedy(path: str, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy tokens, computed once per prompt (greedy output for n tokens is a prefix of more)."""
    key = (path, tuple(prompt))
    if key not in _REFERENCE or len(_REFERENCE[key]) < n:
        _REFERENCE[key] = hf_greedy(path, prompt, max(n, 8))
    return _REFERENCE[key][:n]


def assert_pages_accounted(llm: LLM) -> None:
    """With nothing running, every row is free and every KV page is free or cached, exactly once."""
    stats = llm.stats()
    assert stats["free_rows"] == stats["total_rows"]
    assert stats["free_pages"] + stats["cached_pages"] == stats["total_pages"]
    assert llm.scheduler.cache_manager.unaccounted_pages() == ([], [])
