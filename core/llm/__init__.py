"""The engine's interface. ``LLM`` is imported on first use, so that arrivals (read with the prompt files,
before any model loads) cost no torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core.llm.arrivals import Arrival

if TYPE_CHECKING:
    from core.llm.llm import LLM

__all__ = ["LLM", "Arrival"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from core.llm.llm import LLM

        return LLM
    raise AttributeError(f"module 'core.llm' has no attribute {name!r}")
