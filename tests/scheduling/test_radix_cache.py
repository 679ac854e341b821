"""The radix prefix cache as a data structure: what it matches, what it owns, what it gives back and when.

No model and no torch: pages are plain integers. The property test at the end drives the cache the way the
CacheManager does (match -> lock, insert -> unlock/lock, release, evict, reset) and checks, after every step,
that every page id ever handed out is in exactly one place and that the counters agree with a recount.
"""

from __future__ import annotations

import copy
import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from core.kvcache.radix import RadixPrefixCache


def cache_with(page_size: int, *entries: tuple[list[int], list[int]]) -> RadixPrefixCache:
    cache = RadixPrefixCache(page_size)
    for tokens, pages in entries:
        cache.insert(tokens, pages, None)
    return cache


# ---- matching ------------------------------------------------------------------------------------------------
def test_match_after_insert_returns_the_inserted_pages():
    cache = RadixPrefixCache(page_size=2)
    result = cache.insert([1, 2, 3, 4], [10, 11], None)
    assert result.pages == [10, 11] and result.duplicate_pages == []

    match = cache.match([1, 2, 3, 4, 5, 6])
    assert (match.cached_len, match.pages) == (4, (10, 11))
    assert match.handle is result.handle


def test_match_stops_at_the_first_differing_page():
    cache = cache_with(2, ([1, 2, 3, 4], [10, 11]))
    match = cache.match([1, 2, 3, 9])
    assert (match.cached_len, match.pages) == (2, (10,))


def test_match_of_unknown_tokens_is_empty():
    cache = cache_with(2, ([1, 2, 3, 4], [10, 11]))
    for tokens in ([], [1], [7, 8, 9], [2, 1]):
        match = cache.match(tokens)
        assert (match.cached_len, match.pages, match.handle) == (0, (), None)


def test_match_only_counts_whole_pages_of_the_query():
    cache = cache_with(4, ([1, 2, 3, 4, 5, 6, 7, 8], [10, 11]))
    # the query has 7 tokens: only its first page can match, even though the tree holds tokens 5..7 too
    match = cache.match([1, 2, 3, 4, 5, 6, 7])
    assert (match.cached_len, match.pages) == (4, (10,))


def test_page_size_one_is_a_token_radix_tree():
    cache = cache_with(1, ([5, 6, 7], [0, 1, 2]), ([5, 6, 8], [0, 1, 3]))
    assert cache.match([5, 6, 8, 9]).pages == (0, 1, 3)
    assert cache.match([5, 9]).pages == (0,)
    assert cache.cached_pages == 4


# ---- insertion -----------------------------------------------------------------------------------------------
def test_partial_page_tail_is_not_cached():
    cache = RadixPrefixCache(page_size=4)
    result = cache.insert([1, 2, 3, 4, 5, 6], [10, 11], None)
    assert result.pages == [10]  # page 11 holds only two tokens: it stays the request's
    assert cache.cached_pages == 1
    assert cache.owned_prefix_pages(result.handle) == 1
    assert cache.match([1, 2, 3, 4, 5, 6, 7, 8]).cached_len == 4


def test_fewer_tokens_than_a_page_caches_nothing():
    cache = RadixPrefixCache(page_size=4)
    result = cache.insert([1, 2, 3], [10], None)
    assert (result.pages, result.duplicate_pages, result.handle) == ([], [], None)
    assert cache.cached_pages == 0


def test_insert_splits_an_edge_in_the_middle():
    cache = cache_with(2, ([1, 2, 3, 4, 5, 6], [10, 11, 12]))
    result = cache.insert([1, 2, 3, 4, 9, 9], [20, 21, 22], None)

    assert result.pages == [10, 11, 22]
    assert result.duplicate_pages == [20, 21]
    assert cache.cached_pages == 4
    assert cache.match([1, 2, 3, 4, 5, 6]).pages == (10, 11, 12)
    assert cache.match([1, 2, 3, 4, 9, 9]).pages == (10, 11, 22)
    assert cache.match([1, 2, 3, 4, 7, 7]).pages == (10, 11)
    assert cache.owned_prefix_pages(result.handle) == 3


def test_split_does_not_happen_inside_a_page():
    # [1, 2] and [1, 3] differ inside the first page: with page size 2 they share nothing
    cache = cache_with(2, ([1, 2], [10]), ([1, 3], [20]))
    assert cache.match([1, 2]).pages == (10,)
    assert cache.match([1, 3]).pages == (20,)
    assert cache.cached_pages == 2


def test_same_tokens_twice_with_other_pages_reports_duplicates():
    cache = cache_with(2, ([1, 2, 3, 4], [10, 11]))
    result = cache.insert([1, 2, 3, 4, 5], [20, 21, 22], None)
    assert result.pages == [10, 11]  # the tree keeps its own pages
    assert result.duplicate_pages == [20, 21]  # page 22 (partial) is not the tree's business
    assert cache.cached_pages == 2


def test_same_tokens_with_the_same_pages_are_not_duplicates():
    cache = cache_with(2, ([1, 2, 3, 4], [10, 11]))
    match = cache.match([1, 2, 3, 4])
    result = cache.insert([1, 2, 3, 4, 5, 6], [*match.pages, 12], match.handle)
    assert result.pages == [10, 11, 12] and result.duplicate_pages == []
    assert cache.cached_pages == 3


def test_insert_leaves_refcounts_alone():
    cache = RadixPrefixCache(page_size=1)
    result = cache.insert([1, 2, 3], [10, 11, 12], None)
    assert cache.evictable_pages == 3
    cache.lock(result.handle)
    cache.insert([1, 2, 3, 4], [10, 11, 12, 13], result.handle)
    assert cache.evictable_pages == 1  # only the new page; the locked path stays locked, no more, no less


def test_insert_rejects_too_few_pages():
    with pytest.raises(ValueError):
        RadixPrefixCache(page_size=2).insert([1, 2, 3, 4], [10], None)


def test_page_size_must_be_positive():
    with pytest.raises(ValueError):
        RadixPrefixCache(page_size=0)


# ---- locking -------------------------------------------------------------------------------------------------
def test_locked_nodes_survive_evict():
    cache = cache_with(2, ([1, 2, 3, 4], [10, 11]), ([5, 6], [12]))
    handle = cache.match([1, 2, 3, 4]).handle
    cache.lock(handle)
    assert cache.evictable_pages == 1

    assert cache.evict(100) == [12]
    assert cache.match([1, 2, 3, 4]).pages == (10, 11)
    assert (cache.cached_pages, cache.evictable_pages) == (2, 0)

    cache.unlock(handle)
    assert cache.evictable_pages == 2
    assert sorted(cache.evict(100)) == [10, 11]
    assert cache.cached_pages == 0


def test_locking_a_match_that_ends_mid_edge_protects_only_the_matched_part():
    cache = cache_with(1, ([1, 2, 3, 4, 5], [10, 11, 12, 13, 14]))
    match = cache.match([1, 2, 9])
    assert match.pages == (10, 11)
    cache.lock(match.handle)
    assert cache.evictable_pages == 3
    assert sorted(cache.evict(100)) == [12, 13, 14]
    assert cache.match([1, 2, 3]).pages == (10, 11)


def test_locks_nest_and_stack_across_handles():
    cache = cache_with(1, ([1, 2], [10, 11]), ([1, 3], [10, 13]))
    a, b = cache.match([1, 2]).handle, cache.match([1, 3]).handle
    cache.lock(a)
    cache.lock(b)
    cache.unlock(a)
    assert cache.evictable_pages == 1  # page 11 only; the shared page 10 is still read through b
    assert cache.evict(100) == [11]
    cache.unlock(b)
    assert sorted(cache.evict(100)) == [10, 13]


def test_none_handle_is_a_no_op():
    cache = cache_with(1, ([1], [10]))
    cache.lock(None)
    cache.unlock(None)
    assert cache.owned_prefix_pages(None) == 0
    assert cache.evictable_pages == 1


def test_unlock_without_lock_is_an_error():
    cache = RadixPrefixCache(page_size=1)
    handle = cache.insert([1], [10], None).handle
    with pytest.raises(RuntimeError):
        cache.unlock(handle)


def test_owned_prefix_pages_survives_a_later_split():
    cache = RadixPrefixCache(page_size=1)
    handle = cache.insert([1, 2, 3, 4], [10, 11, 12, 13], None).handle
    cache.lock(handle)
    cache.insert([1, 2, 7], [20, 21, 22], None)  # splits the locked node's edge after two pages
    assert cache.owned_prefix_pages(handle) == 4
    assert cache.evictable_pages == 1  # the split-off upper part inherited the lock
    cache.unlock(handle)
    assert cache.evictable_pages == 5


# ---- eviction ------------------------------------------------------------------------------------------------
def test_evict_takes_the_least_recently_used_leaf_first():
    cache = cache_with(1, ([1, 1], [10, 11]), ([2, 2], [20, 21]), ([3, 3], [30, 31]))
    cache.match([1, 1])  # now [2, 2] is the oldest, then [3, 3], then [1, 1]
    assert cache.evict(1) == [20, 21]  # a leaf goes whole, even when fewer pages were asked for
    assert cache.evict(1) == [30, 31]
    assert cache.evict(1) == [10, 11]
    assert cache.evict(1) == []


def test_insert_counts_as_use():
    cache = cache_with(1, ([1], [10]), ([2], [20]))
    cache.insert([1], [99], None)  # a duplicate, but it refreshes [1]
    assert cache.evict(1) == [20]


def test_a_parent_left_without_children_is_evicted_next():
    cache = cache_with(1, ([1, 2, 3], [10, 11, 12]), ([1, 2, 4], [10, 11, 14]), ([5], [50]))
    cache.match([5])
    # leaves [3] and [4] go before their parent [1, 2]; [5] was used last
    assert cache.evict(4) == [12, 14, 10, 11]
    assert cache.evict(4) == [50]


def test_evict_stops_once_enough_pages_are_freed():
    cache = cache_with(1, ([1], [10]), ([2], [20]), ([3], [30]))
    assert cache.evict(2) == [10, 20]
    assert cache.cached_pages == cache.evictable_pages == 1


def test_evict_nothing_frees_nothing():
    cache = cache_with(1, ([1], [10]))
    assert cache.evict(0) == []
    assert cache.cached_pages == 1


# ---- reset ---------------------------------------------------------------------------------------------------
def test_reset_frees_everything_unlocked_and_keeps_locked_paths():
    cache = cache_with(1, ([1, 2, 3, 4], [10, 11, 12, 13]), ([5, 6], [15, 16]))
    handle = cache.match([1, 2]).handle
    cache.lock(handle)
    assert sorted(cache.reset()) == [12, 13, 15, 16]
    assert (cache.cached_pages, cache.evictable_pages) == (2, 0)
    assert cache.match([1, 2, 3, 4]).pages == (10, 11)

    cache.unlock(handle)
    assert sorted(cache.reset()) == [10, 11]
    assert cache.cached_pages == 0


# ---- the property: every page is in exactly one place --------------------------------------------------------
MAX_PAGES = 10_000


def tree_nodes(cache: RadixPrefixCache) -> list:
    stack, nodes = list(cache._root.children.values()), []
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children.values())
    return nodes


class Request:
    """A running request as the CacheManager sees it: its tokens, its pages and its (locked) handle."""

    def __init__(self, tokens: list[int], pages: list[int], handle: object) -> None:
        self.tokens, self.pages, self.handle = tokens, pages, handle


class RadixCacheMachine(RuleBasedStateMachine):
    """Drives the cache like the CacheManager and checks it against a dict of page-aligned prefixes."""

    requests = Bundle("requests")

    @initialize(page_size=st.sampled_from([1, 2, 4]))
    def setup(self, page_size: int) -> None:
        self.size = page_size
        self.cache = RadixPrefixCache(page_size)
        self.fresh = itertools.count()
        self.allocated = 0
        self.freed: list[int] = []  # pages given back by evict, reset or as duplicates (or by a request)
        self.live: list[Request] = []
        self.model: dict[tuple[int, ...], int] = {}  # cached prefix of k whole pages -> page at position k-1

    # -- helpers ---------------------------------------------------------------------------------------------
    def take(self, n: int) -> list[int]:
        self.allocated += n
        return [next(self.fresh) for _ in range(n)]

    def expected_match(self, tokens: list[int]) -> list[int]:
        pages = []
        for k in range(1, len(tokens) // self.size + 1):
            page = self.model.get(tuple(tokens[: k * self.size]))
            if page is None:
                break
            pages.append(page)
        return pages

    def give_back(self, pages: list[int]) -> None:
        self.freed += pages
        gone = set(pages)
        self.model = {key: page for key, page in self.model.items() if page not in gone}

    def pages_to_cover(self, req: Request) -> None:
        need = -(-len(req.tokens) // self.size) - len(req.pages)
        req.pages += self.take(max(need, 0))

    # -- rules -----------------------------------------------------------------------------------------------
    tokens = st.lists(st.integers(0, 2), min_size=1, max_size=12)

    @rule(target=requests, tokens=tokens)
    def admit(self, tokens: list[int]) -> Request:
        match = self.cache.match(tokens)
        assert list(match.pages) == self.expected_match(tokens)
        assert match.cached_len == len(match.pages) * self.size
        self.cache.lock(match.handle)
        req = Request(list(tokens), list(match.pages), match.handle)
        self.pages_to_cover(req)
        self.live.append(req)
        return req

    @rule(req=requests, more=st.lists(st.integers(0, 2), max_size=5))
    def decode(self, req: Request, more: list[int]) -> None:
        if req in self.live:
            req.tokens += more
            self.pages_to_cover(req)

    @rule(req=consumes(requests), finished=st.booleans())
    def cache_req(self, req: Request, finished: bool) -> None:
        if req not in self.live:
            return
        n = len(req.tokens) // self.size
        expected = self.expected_match(req.tokens)
        result = self.cache.insert(req.tokens, req.pages, req.handle)
        tree_pages = expected + req.pages[len(expected):n]
        assert result.pages == tree_pages
        assert sorted(result.duplicate_pages) == sorted(
            mine for mine, theirs in zip(req.pages[: len(expected)], expected) if mine != theirs)
        assert self.cache.owned_prefix_pages(result.handle) == n
        for k in range(1, n + 1):
            self.model[tuple(req.tokens[: k * self.size])] = result.pages[k - 1]
        self.freed += result.duplicate_pages
        req.pages[:n] = result.pages
        self.cache.unlock(req.handle)
        if finished:
            self.freed += req.pages[n:]
            self.live.remove(req)
        else:
            self.cache.lock(result.handle)
            req.handle = result.handle

    @rule(req=consumes(requests))
    def release(self, req: Request) -> None:
        if req not in self.live:
            return
        self.cache.unlock(req.handle)
        self.freed += req.pages[self.cache.owned_prefix_pages(req.handle):]
        self.live.remove(req)

    @rule(tokens=tokens)
    def match_only(self, tokens: list[int]) -> None:
        assert list(self.cache.match(tokens).pages) == self.expected_match(tokens)

    @rule(num_pages=st.integers(0, 8))
    def evict(self, num_pages: int) -> None:
        evictable = self.cache.evictable_pages
        freed = self.cache.evict(num_pages)
        assert len(freed) >= min(num_pages, evictable)
        assert self.cache.evictable_pages == evictable - len(freed)
        self.give_back(freed)

    @rule()
    def reset(self) -> None:
        self.give_back(self.cache.reset())
        assert self.cache.evictable_pages == 0

    # -- invariants ------------------------------------------------------------------------------------------
    @invariant()
    def every_page_is_in_exactly_one_place(self) -> None:
        if not hasattr(self, "cache"):
            return
        in_tree = [page for node in tree_nodes(self.cache) for page in node.pages]
        private = [page for req in self.live for page in req.pages[self.cache.owned_prefix_pages(req.handle):]]
        everywhere = in_tree + private + self.freed
        assert len(in_tree) == len(set(in_tree)) == self.cache.cached_pages
        assert sorted(everywhere) == list(range(self.allocated))
        assert sorted(in_tree) == sorted(self.model.values())

    @invariant()
    def refcounts_and_counters_match_a_recount(self) -> None:
        if not hasattr(self, "cache"):
            return
        readers: dict[int, int] = {}
        for req in self.live:
            node = req.handle
            while node is not None and node is not self.cache._root:
                readers[id(node)] = readers.get(id(node), 0) + 1
                node = node.parent
        nodes = tree_nodes(self.cache)
        assert all(node.ref == readers.get(id(node), 0) for node in nodes)
        assert self.cache.evictable_pages == sum(len(node.pages) for node in nodes if node.ref == 0)
        # and evict() really can free exactly that many
        assert len(copy.deepcopy(self.cache).evict(MAX_PAGES)) == self.cache.evictable_pages

    @invariant()
    def live_requests_read_the_trees_pages(self) -> None:
        if not hasattr(self, "cache"):
            return
        for req in self.live:
            owned = self.cache.owned_prefix_pages(req.handle)
            assert req.pages[:owned] == self.expected_match(req.tokens[: owned * self.size])


RadixCacheMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
test_radix_cache_state_machine = RadixCacheMachine.TestCase


def test_evictable_in_is_what_locking_the_handle_takes_out_of_the_evictable_pages():
    cache = cache_with(1, ([1, 2, 3, 4], [10, 11, 12, 13]), ([1, 2, 7], [20, 21, 22]))
    shared = cache.match([1, 2, 7, 9]).handle  # path: [1, 2] (shared node) then [7]
    other = cache.match([1, 2, 3, 4]).handle
    cache.lock(other)  # pins [1, 2] and [3, 4]: only [7] of ``shared``'s path is still unlocked
    before = cache.evictable_pages
    assert cache.evictable_in(shared) == 1
    cache.lock(shared)
    assert before - cache.evictable_pages == 1
    assert cache.evictable_in(shared) == 0 and cache.evictable_in(None) == 0
