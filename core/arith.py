"""Integer arithmetic the engine repeats: ceiling division, and the KV pages that hold a number of tokens."""

from __future__ import annotations


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def pages_for(tokens: int, page_size: int) -> int:
    """Pages of ``page_size`` slots that hold ``tokens`` positions of KV."""
    return ceil_div(tokens, page_size)
