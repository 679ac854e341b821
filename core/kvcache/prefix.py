"""The interface every prefix cache offers to the CacheManager.

A prefix cache maps token sequences to the KV pages that hold them. It owns the pages it has been given
(``insert``) until it evicts them; ``lock``/``unlock`` keep pages that a running request reads from being
evicted under it. Handles are opaque to everyone but the cache (``None`` means "nothing").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class PrefixMatch:
    cached_len: int  # tokens whose KV can be reused
    pages: tuple[int, ...]  # pages covering positions [0, cached_len)
    handle: object = None


@dataclass(frozen=True)
class InsertResult:
    pages: list[int]  # the cache's pages for the request's leading positions (now owned by the cache)
    duplicate_pages: list[int] = field(default_factory=list)  # request pages the cache already had: free them
    handle: object = None


@dataclass(frozen=True)
class CachedSpan:
    """One node of a prefix cache's tree, for views of it (the cache itself never needs this)."""

    node_id: int
    parent_id: int | None  # None: a child of the root
    tokens: tuple[int, ...]
    pages: int
    lock_count: int


class PrefixCache(Protocol):
    def match(self, token_ids: list[int]) -> PrefixMatch: ...

    def insert(self, token_ids: list[int], pages: list[int], handle: object) -> InsertResult: ...

    def lock(self, handle: object) -> None: ...

    def unlock(self, handle: object) -> None: ...

    def evictable_in(self, handle: object) -> int: ...

    def owned_prefix_pages(self, handle: object) -> int: ...

    def owned_pages(self) -> list[int]: ...

    def evict(self, num_pages: int) -> list[int]: ...

    def reset(self) -> list[int]: ...

    def spans(self) -> list[CachedSpan]: ...

    def path_ids(self, handle: object) -> list[int]: ...

    @property
    def evictable_pages(self) -> int: ...

    @property
    def cached_pages(self) -> int: ...
