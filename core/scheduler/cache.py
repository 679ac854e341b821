"""CacheManager: KV page allocation, and the face of the prefix cache.

Pages are handed out from a free list and recorded in the page table (position -> slot) for the request that
holds them; what becomes of them once it is done is the prefix cache's business (core/kvcache/).
"""

from __future__ import annotations

from collections import Counter

import torch

from core.arith import pages_for
from core.kvcache.naive import NaivePrefixCache
from core.kvcache.prefix import PrefixCache, PrefixMatch
from core.kvcache.radix import RadixPrefixCache
from core.request import Req
from core.scheduler.fence import ReleaseFence
from core.transfer import upload_list


class OutOfPagesError(RuntimeError):
    """Admission control should make this impossible; raised if the accounting is ever wrong."""


class CacheManager:
    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor, cache_type: str,
                 fence: ReleaseFence | None = None) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.page_table = page_table
        if page_table.shape[1] % page_size:
            raise ValueError(f"the page table's width {page_table.shape[1]} is not a multiple of the page size "
                             f"{page_size}")
        # a stack: pages are taken from and given back at the end, in O(pages moved) whatever the pool's size
        self._free_pages: list[int] = list(range(num_pages - 1, -1, -1))
        self.fence = fence or ReleaseFence()
        self.evicted_pages = 0  # cumulative: cached pages taken back to make room
        self.prefix_cache: PrefixCache = RadixPrefixCache(page_size) if cache_type == "radix" else NaivePrefixCache()
        self.reuses_prefixes = cache_type != "naive"

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
        self._write_page_table([(req, 0, len(match.pages))])

    # ---- allocation ----------------------------------------------------------------------------------------
    def allocate(self, reqs: list[Req]) -> None:
        """Make sure every request has KV slots for positions [0, device_len): one hand-out, one upload."""
        size = self.page_size
        # most steps give most requests no new page: one comparison each finds those that need one
        needs = [(req, pages_for(req.device_len, size) - len(req.pages)) for req in reqs
                 if req.device_len > len(req.pages) * size]
        if not needs:
            return
        taken = self._take(sum(n for _, n in needs))
        spans: list[tuple[Req, int, int]] = []
        start = 0
        for req, n in needs:
            spans.append((req, len(req.pages), len(req.pages) + n))
            req.pages.extend(taken[start:start + n])
            start += n
        self._write_page_table(spans)

    def _take(self, n: int) -> list[int]:
        free = self._free_pages
        if n > len(free):
            evicted = self.prefix_cache.evict(n - len(free))
            self.evicted_pages += len(evicted)
            free.extend(evicted)
        if n > len(free):
            raise OutOfPagesError(f"needed {n} KV pages, only {len(free)} free")
        taken = free[-n:]
        del free[-n:]
        taken.reverse()
        return taken

    def _write_page_table(self, spans: list[tuple[Req, int, int]]) -> None:
        """Record each (req, first, last)'s pages [first, last) in the page table: one upload of one entry per
        page, whose ``page_size`` slots are spread out on the device."""
        size = self.page_size
        rows: list[int] = []
        first_cols: list[int] = []  # the position of each page's first slot
        pages: list[int] = []
        for req, first, last in spans:
            rows += [req.table_idx] * (last - first)
            first_cols += range(first * size, last * size, size)
            pages += req.pages[first:last]
        if not rows:
            return
        device = self.page_table.device
        per_page = upload_list(rows + first_cols + pages, torch.int64, device).view(3, -1)
        offsets = torch.arange(size, device=device)
        self.page_table[per_page[0, :, None], per_page[1, :, None] + offsets] = per_page[2, :, None] * size + offsets

    # ---- release -------------------------------------------------------------------------------------------
    def cache_req(self, req: Req, finished: bool) -> None:
        """Hand the request's computed KV (positions [0, cached_len)) to the prefix cache, which may keep its
        leading pages; when finished, free the pages the cache does not keep."""
        # A finished request's last token was never fed back, so has no KV: under overlap scheduling cached_len
        # can already count it (the request was in the next step when it stopped on EOS), so cap it here.
        known = min(req.cached_len, len(req.input_ids) - 1 if finished else len(req.input_ids))
        result = self.prefix_cache.insert(req.input_ids[:known], req.pages, req.cache_handle)
        self._give_back(result.duplicate_pages)
        if result.duplicate_pages:  # an identical prefix was cached meanwhile: read the cache's copy from now on
            req.pages[: len(result.pages)] = result.pages
            if not finished:
                self._write_page_table([(req, 0, len(result.pages))])
        self.prefix_cache.unlock(req.cache_handle)
        req.cache_handle = None
        if finished:
            self._give_back(req.pages[len(result.pages):])
            req.pages = []
        else:
            self.prefix_cache.lock(result.handle)
            req.cache_handle = result.handle

    def release(self, req: Req) -> None:
        """Drop a request without caching anything new (abort, error)."""
        self.prefix_cache.unlock(req.cache_handle)
        owned = self.prefix_cache.owned_prefix_pages(req.cache_handle)
        req.cache_handle = None
        self._give_back(req.pages[owned:])
        req.pages = []

    def _give_back(self, pages: list[int]) -> None:
        """Pages a request no longer needs; an in-flight batch may still write them, hence the fence."""
        self.fence.free(self._free_pages, pages)

    def reset_prefix_cache(self) -> int:
        """Empty the prefix cache and return the pages freed. Safe at any step: pages that a running request reads
        are locked and stay until it lets go of them."""
        # no fence needed for the cache's pages: only the device writes a page's KV, in launch order, so a new
        # owner's writes come after every batch that read the page before
        freed = self.prefix_cache.reset()
        self._free_pages.extend(freed)
        return len(freed)
