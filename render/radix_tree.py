"""The radix prefix cache as a tree: each node's tokens, pages, lock count and the requests reading it.

A locked node (lock > 0) is read by running requests and cannot be evicted; an unlocked one is kept only for
reuse and is the first to go (least recently used leaf first) when pages run short.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.text import Text
from rich.tree import Tree

from core.words import plural
from core.events import RadixNodeView
from render.kv_bar import request_style
from render.style import one_line

SPAN_CHARS = 24


def node_label(node: RadixNodeView, decode: Callable[[list[int]], str] | None) -> Text:
    span = decode(list(node.first_tokens)) if decode else " ".join(map(str, node.first_tokens))
    more = "…" if node.num_tokens > len(node.first_tokens) else ""
    label = Text.assemble(("[", "dim"), one_line(span[:SPAN_CHARS]), (more + "]", "dim"),
                          f" {node.num_tokens} tok · {node.pages} page{'s' if node.pages != 1 else ''} · ")
    if node.lock_count:
        label.append(f"lock {node.lock_count}", style="bold")
        for uid in node.holders:
            label.append(" ")
            label.append(f"uid{uid}", style=request_style(uid))
    else:
        label.append("unlocked, evictable", style="dim")
    return label


def radix_tree(nodes: Sequence[RadixNodeView], decode: Callable[[list[int]], str] | None = None,
               evicted_pages: int = 0, title: str = "radix cache") -> Tree:
    header = Text(title, style="bold")
    header.append(f" · {plural(len(nodes), 'node')} · {plural(sum(n.pages for n in nodes), 'page')}", style="dim")
    if evicted_pages:
        header.append(f" · evicted {plural(evicted_pages, 'page')} this step", style="red")
    root = Tree(header)
    branches: dict[int | None, Tree] = {None: root}
    for node in nodes:  # parents come before their children
        parent = branches.get(node.parent_id, root)
        branches[node.node_id] = parent.add(node_label(node, decode))
    if not nodes:
        root.add(Text("empty", style="dim"))
    return root
