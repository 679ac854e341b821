"""CacheManager: KV page allocation, and the face of the prefix cache.

Pages are handed out from a free list and recorded in the page table (position -> slot) for the request that
holds them. What happens to a request's pages when it is done is the prefix cache's business: the naive
cache frees them all; the radix cache keeps full pages of known tokens for later requests to reuse.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

import torch

from core.kvcache.naive import NaivePrefixCache
from core.kvcache.prefix import PrefixCache, PrefixMatch
from core.request import Req
from core.scheduler.decode import pages_for


@dataclass
class _PageTableWrites:
    """Page-table entries gathered over a batch and written in one indexing op."""

    rows: list[int] = field(default_factory=list)
    cols: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)


class OutOfPagesError(RuntimeError):
    """Admission control should make this impossible; raised if the accounting is ever wrong."""


class CacheManager:
    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor, cache_type: str) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.page_table = page_table
        self.max_seq_len = page_table.shape[1]
        self._free_pages: deque[int] = deque(range(num_pages))  # FIFO; taking n pages costs O(n)
        self.evicted_pages = 0  # cumulative: cached pages taken back to make room
        self.prefix_cache: PrefixCache = self._make_prefix_cache(cache_type)
        self.reuses_prefixes = cache_type != "naive"

    def _make_prefix_cache(self, cache_type: str) -> PrefixCache:
        if cache_type == "radix":
            from core.kvcache.radix import RadixPrefixCache

            return RadixPrefixCache(self.page_size)
        return NaivePrefixCache()

    # ---- accounting ----------------------------------------------------------------------------------------
    @property
    def free_pages(self) -> int:
        return len(self._free_pages)

    @property
    def available_pages(self) -> int:
        """Pages a new request could get: free ones plus cached ones nobody is using (evictable)."""
        return len(self._free_pages) + self.prefix_cache.evictable_pages

    @property
    def cached_pages(self) -> int:
        return self.prefix_cache.cached_pages

    def unaccounted_pages(self) -> tuple[list[int], list[int]]:
        """With no request running every page is free or cached, exactly once: (lost, doubled) should be empty."""
        seen = Counter([*self._free_pages, *self.prefix_cache.owned_pages()])
        doubled = sorted(page for page, count in seen.items() if count > 1)
        lost = sorted(set(range(self.num_pages)) - seen.keys())
        return lost, doubled

    @property
    def used_pages(self) -> int:
        return self.num_pages - len(self._free_pages)

    # ---- prefix reuse --------------------------------------------------------------------------------------
    def match(self, token_ids: list[int]) -> PrefixMatch:
        """The longest cached prefix, always leaving at least the last prompt token to compute."""
        return self.prefix_cache.match(token_ids[:-1])

    def adopt(self, req: Req, match: PrefixMatch) -> None:
        """Give a newly admitted request the matched pages (locked while it uses them)."""
        self.prefix_cache.lock(match.handle)
        req.cache_handle = match.handle
        req.pages = list(match.pages)
        self._record(req, 0, len(match.pages))

    # ---- allocation ----------------------------------------------------------------------------------------
    def allocate(self, reqs: list[Req]) -> None:
        """Make sure every request has KV slots for positions [0, device_len)."""
        writes = _PageTableWrites()
        for req in reqs:
            need = pages_for(req.device_len, self.page_size) - len(req.pages)
            if need <= 0:
                continue
            first = len(req.pages)
            req.pages.extend(self._take(need))
            self._collect(req, first, len(req.pages), writes)
        self._flush(writes)

    def _take(self, n: int) -> list[int]:
        if n > len(self._free_pages):
            evicted = self.prefix_cache.evict(n - len(self._free_pages))
            self.evicted_pages += len(evicted)
            self._free_pages.extend(evicted)
        if n > len(self._free_pages):
            raise OutOfPagesError(f"needed {n} KV pages, only {len(self._free_pages)} free")
        return [self._free_pages.popleft() for _ in range(n)]

    def _record(self, req: Req, first: int, last: int) -> None:
        writes = _PageTableWrites()
        self._collect(req, first, last, writes)
        self._flush(writes)

    def _collect(self, req: Req, first: int, last: int, writes: _PageTableWrites) -> None:
        size = self.page_size
        for i in range(first, last):
            for offset in range(size):
                col = i * size + offset
                if col >= self.max_seq_len:
                    break
                writes.rows.append(req.table_idx)
                writes.cols.append(col)
                writes.slots.append(req.pages[i] * size + offset)

    def _flush(self, writes: _PageTableWrites) -> None:
        if not writes.rows:
            return
        device = self.page_table.device
        rows = torch.tensor(writes.rows, dtype=torch.int64).to(device, non_blocking=True)
        cols = torch.tensor(writes.cols, dtype=torch.int64).to(device, non_blocking=True)
        slots = torch.tensor(writes.slots, dtype=torch.int64).to(device, non_blocking=True)
        self.page_table[rows, cols] = slots

    # ---- release -------------------------------------------------------------------------------------------
    def cache_req(self, req: Req, finished: bool) -> None:
        """Hand the request's computed KV to the prefix cache; when finished, release what it does not keep.

        KV exists for positions [0, cached_len). The cache may keep some of the request's pages (returned by
        ``insert`` as the number of leading pages it now owns) and the rest of a finished request's pages are
        freed.
        """
        tokens = req.input_ids[: req.cached_len]
        result = self.prefix_cache.insert(tokens, req.pages, req.cache_handle)
        self._free_pages.extend(result.duplicate_pages)
        if result.duplicate_pages:  # an identical prefix was cached meanwhile: read the cache's copy from now on
            req.pages[: len(result.pages)] = result.pages
            if not finished:
                self._record(req, 0, len(result.pages))
        self.prefix_cache.unlock(req.cache_handle)
        req.cache_handle = None
        if finished:
            self._free_pages.extend(req.pages[len(result.pages):])
            req.pages = []
        else:
            self.prefix_cache.lock(result.handle)
            req.cache_handle = result.handle

    def release(self, req: Req) -> None:
        """Drop a request without caching anything new (abort, error)."""
        self.prefix_cache.unlock(req.cache_handle)
        owned = self.prefix_cache.owned_prefix_pages(req.cache_handle)
        req.cache_handle = None
        self._free_pages.extend(req.pages[owned:])
        req.pages = []

    def reset_prefix_cache(self) -> None:
        self._free_pages.extend(self.prefix_cache.reset())
