"""The radix prefix cache: requests that share a prompt prefix share the KV pages that hold it.

The tree is keyed by token ids, one whole KV page at a time: a node's edge is ``len(pages) * page_size`` tokens
and it owns exactly those pages. Only full pages are cached, because a partly written page cannot be shared
(the next request would write its own tokens into the free slots); edges are compared and split at page
boundaries only (with ``page_size == 1``, an ordinary token radix tree).

Pages handed to ``insert`` at positions the tree did not have become the tree's until ``evict`` or ``reset``
gives them back. A handle is a node; ``lock`` counts a reader on every node from it up to the root, so a locked
node's whole path stays put and an unlocked node (ref 0) has no locked descendant: "evictable" is simply "in a
node with ref 0", and both counters are kept up to date on every change instead of recounted every step. LRU
uses a monotonic tick rather than wall time, so that eviction order is deterministic and testable.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from core.kvcache.prefix import CachedSpan, InsertResult, PrefixMatch

Tokens = tuple[int, ...]


@dataclass(eq=False)  # identity semantics: nodes live in sets and serve as handles
class _Node:
    tokens: Tokens  # the edge label: len(pages) * page_size token ids
    pages: list[int]  # the KV pages holding those tokens, in position order
    parent: _Node | None
    depth: int  # pages on the path from the root to the end of this node
    uid: int  # creation order; breaks LRU ties deterministically
    children: dict[Tokens, _Node] = field(default_factory=dict)  # keyed by the child's first page of tokens
    ref: int = 0  # readers whose handle is this node or a descendant
    last_access: int = 0


def _as_node(handle: object) -> _Node:
    if not isinstance(handle, _Node):
        raise TypeError(f"not a radix cache handle: {handle!r}")
    return handle


def _lru_key(node: _Node) -> tuple[int, int, _Node]:
    """Least recently used first; among equals, the older node."""
    return node.last_access, node.uid, node


class RadixPrefixCache:
    def __init__(self, page_size: int) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {page_size}")
        self.page_size = page_size
        self._root = _Node(tokens=(), pages=[], parent=None, depth=0, uid=0)
        self._clock = 0
        self._next_uid = 1
        self._cached = 0
        self._evictable = 0
        # unlocked nodes without children: exactly the nodes evict() may take right now
        self._evictable_leaves: set[_Node] = set()

    # ---- counters ------------------------------------------------------------------------------------------
    @property
    def cached_pages(self) -> int:
        """All pages the tree owns."""
        return self._cached

    @property
    def evictable_pages(self) -> int:
        """Pages that ``evict`` would free if asked for everything: those in nodes nobody has locked."""
        return self._evictable

    # ---- lookup and insertion ------------------------------------------------------------------------------
    def match(self, token_ids: list[int]) -> PrefixMatch:
        """The longest cached whole-page prefix of ``token_ids``; marks that path as recently used. A match that
        ends inside an edge splits the edge there, so that the handle's path covers exactly the matched pages:
        locking it then protects them without pinning the unmatched rest of the edge."""
        tokens = self._full_pages(token_ids)
        self._clock += 1
        node = self._descend(tokens)
        pages = self._path_pages(node)
        return PrefixMatch(len(pages) * self.page_size, tuple(pages), self._handle(node))

    def insert(self, token_ids: list[int], pages: list[int], handle: object) -> InsertResult:
        """Cache the full pages of ``token_ids``; the tree keeps its own page wherever it already had one.
        ``handle`` (the request's current lock) is not needed to find the path and refcounts are left alone: the
        caller unlocks its old handle and locks the returned one itself."""
        tokens = self._full_pages(token_ids)
        num_pages = len(tokens) // self.page_size
        if len(pages) < num_pages:
            raise ValueError(f"{num_pages} full pages of tokens but only {len(pages)} pages given")
        self._clock += 1
        node = self._descend(tokens)
        tree_pages = self._path_pages(node)
        matched = len(tree_pages)
        duplicates = [mine for mine, theirs in zip(pages[:matched], tree_pages) if mine != theirs]
        if matched < num_pages:
            new_pages = list(pages[matched:num_pages])
            node = self._add_leaf(node, tokens[matched * self.page_size:], new_pages)
            tree_pages += new_pages
        return InsertResult(tree_pages, duplicates, self._handle(node))

    def _full_pages(self, token_ids: list[int]) -> Tokens:
        """The whole-page prefix: a partly filled last page is never cached."""
        return tuple(token_ids[: len(token_ids) // self.page_size * self.page_size])

    def _descend(self, tokens: Tokens) -> _Node:
        """Follow ``tokens`` from the root as far as the tree holds them, touching each node on the way: the node
        whose end is exactly the end of the match (an edge is split if needed)."""
        size = self.page_size
        node, pos = self._root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos: pos + size])
            if child is None:
                break
            common = self._common_pages(child, tokens, pos)
            if common < len(child.pages):
                child = self._split(child, common)
            child.last_access = self._clock
            node, pos = child, pos + common * size
        return node

    def _common_pages(self, node: _Node, tokens: Tokens, pos: int) -> int:
        """How many of ``node``'s pages agree with ``tokens`` from token ``pos`` on (at least 1 when called)."""
        size = self.page_size
        count = 0
        for start in range(0, len(node.tokens), size):
            if node.tokens[start: start + size] != tokens[pos + start: pos + start + size]:
                break
            count += 1
        return count

    def _split(self, node: _Node, num_pages: int) -> _Node:
        """Cut ``node``'s edge after ``num_pages`` pages; the new upper node is returned. ``node`` keeps the lower
        part, so a handle held on it still names the same path and depth; the upper part carries the same readers
        (every lock through ``node`` passes through it), so counters do not move."""
        parent = node.parent
        assert parent is not None, "the root is never split"
        cut = num_pages * self.page_size
        upper = _Node(tokens=node.tokens[:cut], pages=node.pages[:num_pages], parent=parent,
                      depth=parent.depth + num_pages, uid=self._new_uid(), ref=node.ref,
                      last_access=node.last_access)
        parent.children[upper.tokens[: self.page_size]] = upper
        node.tokens, node.pages, node.parent = node.tokens[cut:], node.pages[num_pages:], upper
        upper.children[node.tokens[: self.page_size]] = node
        return upper

    def _add_leaf(self, parent: _Node, tokens: Tokens, pages: list[int]) -> _Node:
        leaf = _Node(tokens=tokens, pages=pages, parent=parent, depth=parent.depth + len(pages),
                     uid=self._new_uid(), last_access=self._clock)
        parent.children[tokens[: self.page_size]] = leaf
        self._cached += len(pages)
        self._evictable += len(pages)
        self._refresh_leaf(parent)
        self._refresh_leaf(leaf)
        return leaf

    def _path_pages(self, node: _Node) -> list[int]:
        return [page for each in reversed(self._path(node)) for page in each.pages]

    def _handle(self, node: _Node) -> _Node | None:
        return None if node is self._root else node

    def _new_uid(self) -> int:
        self._next_uid += 1
        return self._next_uid

    # ---- readers -------------------------------------------------------------------------------------------
    def lock(self, handle: object) -> None:
        """Pin the handle's path: a running request reads these pages."""
        for node in self._path(handle):
            if node.ref == 0:
                self._evictable -= len(node.pages)
            node.ref += 1
            self._refresh_leaf(node)

    def unlock(self, handle: object) -> None:
        for node in self._path(handle):
            if node.ref == 0:
                raise RuntimeError("unlock of a prefix-cache node that is not locked")
            node.ref -= 1
            if node.ref == 0:
                self._evictable += len(node.pages)
            self._refresh_leaf(node)

    def evictable_in(self, handle: object) -> int:
        """Pages on the handle's path nobody has locked, which locking it takes out of ``evictable_pages``."""
        return sum(len(node.pages) for node in self._path(handle) if node.ref == 0)

    def owned_prefix_pages(self, handle: object) -> int:
        """How many of the request's leading pages belong to the tree (the caller must not free them)."""
        return 0 if handle is None else _as_node(handle).depth

    def _path(self, handle: object) -> list[_Node]:
        """The nodes from the handle's node up to (not including) the root; empty for ``None``."""
        nodes: list[_Node] = []
        node = None if handle is None else _as_node(handle)
        while node is not None and node is not self._root:
            nodes.append(node)
            node = node.parent
        return nodes

    def owned_pages(self) -> list[int]:
        """Every page the tree owns, for audits (walks the whole tree)."""
        return [page for node in self._subtree(self._root) for page in node.pages]

    def _subtree(self, node: _Node) -> list[_Node]:
        """``node`` and every node below it, each parent before its children."""
        order: list[_Node] = []
        stack = [node]
        while stack:  # iterative: a long chain of single-page branches must not hit the recursion limit
            order.append(stack.pop())
            stack.extend(order[-1].children.values())
        return order

    def spans(self) -> list[CachedSpan]:
        """Every node, parents before children and siblings in creation order, for views of the tree."""
        spans: list[CachedSpan] = []
        queue = sorted(self._root.children.values(), key=lambda n: n.uid)
        while queue:
            node = queue.pop(0)
            parent = None if node.parent is self._root else node.parent.uid
            spans.append(CachedSpan(node.uid, parent, node.tokens, len(node.pages), node.ref))
            queue.extend(sorted(node.children.values(), key=lambda n: n.uid))
        return spans

    def path_ids(self, handle: object) -> list[int]:
        """The ids of the nodes a handle runs through, root side first."""
        return [node.uid for node in reversed(self._path(handle))]

    # ---- giving pages back ---------------------------------------------------------------------------------
    def evict(self, num_pages: int) -> list[int]:
        """Free unlocked leaves, least recently used first, until ``num_pages`` pages are freed or none are left.
        A leaf goes whole (all its pages); a parent left without children becomes a candidate in turn."""
        heap = [_lru_key(node) for node in self._evictable_leaves]
        heapq.heapify(heap)
        freed: list[int] = []
        while heap and len(freed) < num_pages:
            node = heapq.heappop(heap)[-1]
            parent = node.parent
            freed += self._remove(node)
            if parent in self._evictable_leaves:
                heapq.heappush(heap, _lru_key(parent))
        return freed

    def reset(self) -> list[int]:
        """Drop everything no request is reading; locked paths stay so their readers' pages remain valid."""
        freed: list[int] = []
        stack = [self._root]
        while stack:
            node = stack.pop()
            for child in list(node.children.values()):
                if child.ref == 0:  # unlocked, and so is every node below it: remove them all, children first
                    freed += [page for each in reversed(self._subtree(child)) for page in self._remove(each)]
                else:
                    stack.append(child)
        return freed

    def _remove(self, node: _Node) -> list[int]:
        """Detach an unlocked childless node and give back its pages."""
        assert node.ref == 0 and not node.children and node.parent is not None
        parent = node.parent
        del parent.children[node.tokens[: self.page_size]]
        node.parent = None
        self._cached -= len(node.pages)
        self._evictable -= len(node.pages)
        self._evictable_leaves.discard(node)
        self._refresh_leaf(parent)
        return node.pages

    def _refresh_leaf(self, node: _Node) -> None:
        """Keep ``_evictable_leaves`` exact after ``node``'s children or refcount changed."""
        if node is not self._root and node.ref == 0 and not node.children:
            self._evictable_leaves.add(node)
        else:
            self._evictable_leaves.discard(node)
