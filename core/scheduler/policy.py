"""Which phase runs next, one per step: prefill whenever something waits and fits, except that after
``max_streak`` prefill steps in a row while requests decode one decode step is forced, so a steady stream of
prompts can delay decoding but never stall it."""

from __future__ import annotations

from dataclasses import dataclass
from core.words import plural


@dataclass
class PhasePolicy:
    max_streak: int
    streak: int = 0  # prefill steps in a row while requests were decoding

    def forced_decode(self, decoding: bool) -> str:
        """Why this step must decode whatever waits (the step event's note), or '' if prefill may go first."""
        if decoding and self.streak >= self.max_streak:
            return f"decode forced after {plural(self.streak, 'prefill step')}"
        return ""

    def record(self, prefilled: bool, decoding: bool) -> None:
        """Count the step just scheduled (or tried: a decode step with nothing to decode also ends a streak)."""
        self.streak = self.streak + 1 if prefilled and decoding else 0
