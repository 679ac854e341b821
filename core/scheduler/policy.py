"""Which phase runs next, one per step: prefill whenever something waits and fits, except that after
``max_streak`` prefill steps in a row while requests decode one decode step is forced, so a steady stream of
prompts can delay decoding but never stall it.

A burst is the exception: while requests not yet started hold at least a full prefill chunk of prompt tokens,
those chunks run back to back, and the requests already decoding wait once, for all of them, rather than once per
chunk. A client sending many prompts at once then stretches one gap of each running request instead of every gap
while the burst is worked off, so the tail of the gaps between tokens stays that of decode steps, and every request
of the burst starts decoding sooner, in larger batches. A trickle of prompts never makes a full chunk, and the
chunks of one long prompt are not a burst: both still take turns with decoding, so the longest gap stays one
chunk. A burst is bounded by what can be admitted: once the table's rows or the pool's pages are taken, prefill
cannot go on and decoding runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from core.scheduler.prefill import Queued
from core.words import plural


@dataclass
class PhasePolicy:
    max_streak: int
    streak: int = 0  # prefill steps in a row while requests were decoding

    def forced_decode(self, decoding: bool, queued: Callable[[], Queued]) -> str:
        """Why this step must decode whatever waits (the step event's note), or '' if prefill may go first.
        ``queued`` looks at the queue, only once the streak is long enough for it to matter."""
        if decoding and self.streak >= self.max_streak and queued() == "some":
            return f"decode forced after {plural(self.streak, 'prefill step')}"
        return ""

    def record(self, prefilled: bool, decoding: bool) -> str:
        """Count the step just scheduled (or tried: a decode step with nothing to decode also ends a streak).
        Returns the note of a prefill step that went past the streak because a burst waited, or ''."""
        before = self.streak
        self.streak = before + 1 if prefilled and decoding else 0
        if not (prefilled and decoding and before >= self.max_streak):
            return ""
        return f"prefill kept on after {plural(before, 'prefill step')}: a burst of new prompts waits"
