"""Integer arithmetic the engine repeats."""

from __future__ import annotations


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def pages_for(tokens: int, page_size: int) -> int:
    """Pages of ``page_size`` slots that hold ``tokens`` positions of KV."""
    return ceil_div(tokens, page_size)


def next_pow2(n: int) -> int:
    """The smallest power of two at least ``n`` (n >= 1): a kernel block's size for ``n`` rows or heads."""
    return 1 << (n - 1).bit_length()
