"""The naive prefix cache: remembers nothing, so every request prefills its whole prompt."""

from __future__ import annotations

from core.kvcache.prefix import CachedSpan, InsertResult, PrefixMatch


class NaivePrefixCache:
    evictable_pages = 0
    cached_pages = 0

    def match(self, token_ids: list[int]) -> PrefixMatch:
        return PrefixMatch(0, ())

    def insert(self, token_ids: list[int], pages: list[int], handle: object) -> InsertResult:
        return InsertResult([])

    def lock(self, handle: object) -> None:
        pass

    def unlock(self, handle: object) -> None:
        pass

    def evictable_in(self, handle: object) -> int:
        return 0

    def owned_prefix_pages(self, handle: object) -> int:
        return 0

    def owned_pages(self) -> list[int]:
        return []

    def evict(self, num_pages: int) -> list[int]:
        return []

    def reset(self) -> list[int]:
        return []

    def spans(self) -> list[CachedSpan]:
        return []

    def path_ids(self, handle: object) -> list[int]:
        return []
