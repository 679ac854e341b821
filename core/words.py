"""Words the messages share: counts ('1 request', '3 requests', '23,301 tokens', so no message says '1 requests'),
and how the engine's ready line starts."""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` (thousands separated) and ``noun``, or its plural ``many`` (default noun + 's') unless the count
    is one."""
    return f"{count:,} {noun if count == 1 else many or noun + 's'}"


# Engine.summary's first words: the command line prints that line (and any after it) below the load line
ENGINE_READY = "engine ready"
