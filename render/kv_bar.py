"""The KV pool as one bar: each running request's own pages, the prefix cache's, and the free ones.

Widths are proportional to pages, but anything that holds a page gets at least one cell, so a request with 3
pages in a pool of 20,000 is still visible. The counts follow the bar, so nothing depends on reading widths.
"""

from __future__ import annotations

from rich.text import Text

from core.events import KVUsage

REQUEST_STYLES = ("cyan", "green", "yellow", "magenta", "blue", "red")
CACHE_STYLE, FREE_STYLE = "bright_black", "dim"
REQUEST_CHAR, CACHE_CHAR, FREE_CHAR = "█", "▒", "·"
LISTED_REQUESTS = 4  # requests named after the bar; the rest are summed, so the line stays short


def request_style(uid: int) -> str:
    return REQUEST_STYLES[uid % len(REQUEST_STYLES)]


def _cells(parts: list[int], width: int) -> list[int]:
    """Split ``width`` cells over the parts in proportion, at least one for any part that is not empty."""
    total = sum(parts) or 1
    cells = [max(1, round(p * width / total)) if p else 0 for p in parts]
    while sum(cells) > width and max(cells) > 1:  # the minimum widths pushed it over: take from the widest
        cells[cells.index(max(cells))] -= 1
    return cells


def kv_bar(kv: KVUsage, width: int = 40) -> Text:
    """``[████▒▒▒·········] uid0 12 · uid1 9 · cached 30 · free 949/1000`` (pages)"""
    held = [pages for _, pages in kv.by_request]
    cells = _cells(held + [kv.cached, kv.free], width)
    bar = Text("[")
    for (uid, _), n in zip(kv.by_request, cells):
        bar.append(REQUEST_CHAR * n, style=request_style(uid))
    bar.append(CACHE_CHAR * cells[-2], style=CACHE_STYLE)
    bar.append(FREE_CHAR * cells[-1], style=FREE_STYLE)
    bar.append("] ")
    for uid, pages in kv.by_request[:LISTED_REQUESTS]:
        bar.append(f"uid{uid}", style=request_style(uid))
        bar.append(f" {pages} · ")
    if len(kv.by_request) > LISTED_REQUESTS:
        rest = kv.by_request[LISTED_REQUESTS:]
        bar.append(f"{len(rest)} more {sum(p for _, p in rest)} · ")
    bar.append("cached", style=CACHE_STYLE)
    bar.append(f" {kv.cached} · free {kv.free}/{kv.total}")
    return bar
