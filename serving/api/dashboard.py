"""The live dashboard's server side: a bounded ring of the newest step events, and one SSE stream per viewer.

The engine never waits on a viewer. Step events reach ``StepRing.add`` on the receiver thread, which only appends
to a bounded deque and, at most once until the loop has run it, schedules a wake-up on the asyncio loop. Each
viewer's stream sends the steps that came since its previous send, or, when more came than it can be expected
to want (it lagged: its socket was full, or the engine is fast), only the newest, with the skipped steps'
arrivals and finishes folded in. A viewer that stops reading blocks only its own stream, in its own send, and
holds one message and its socket's buffer: the ring moves on without it.

The radix tree costs the engine a walk per step, so it is asked for only while some viewer's stream wants it.

The page and each step's record are shaped in render/ (render/dashboard_page.py); the command hands them in (the
page as text, the record as a function), so this side stays free of the views.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from core.events import StepEvent

# one step's record for the page: the step, and the steps folded into it that a lagging viewer will never see
StepRecord = Callable[[StepEvent, list[StepEvent]], dict[str, Any]]

HISTORY = 240  # steps a viewer can step back through, and the ring's size
CATCH_UP = 8  # a viewer this many steps behind or more gets only the newest
SEND_EVERY_S = 0.05  # a viewer gets at most this many sends a second, however fast the engine steps
FIGURES_EVERY_S = 1.0


class StepRing:
    """The newest step events of one server, for any number of viewers."""

    def __init__(self, record: StepRecord, *, history: int = HISTORY,
                 report_radix: Callable[[bool], None] | None = None,
                 figures: Callable[[], dict[str, Any]] | None = None) -> None:
        self.record, self.history, self.figures = record, history, figures
        self._ring: deque[StepEvent] = deque(maxlen=history)
        self._report_radix = report_radix
        self._radix_viewers = 0
        self._viewers: set[asyncio.Event] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake_pending = threading.Event()
        self._records: dict[int, str] = {}  # step -> its JSON, shaped once for every viewer that sends it alone
        self._closed = False

    # ---- the receiver thread ----------------------------------------------------------------------------
    def add(self, event: StepEvent) -> None:
        """Never blocks: a deque append, and one wake-up call scheduled until the loop has run it."""
        self._ring.append(event)
        loop = self._loop
        if loop is not None and self._viewers and not self._wake_pending.is_set():
            self._wake_pending.set()
            try:
                loop.call_soon_threadsafe(self._wake)
            except RuntimeError:  # the loop has closed: the server is leaving
                pass

    def close(self) -> None:
        """The server is leaving: every viewer's stream ends, so that an open page never holds the drain up
        (its page reconnects to whatever answers next). Safe from a signal handler or any thread."""
        self._closed = True
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._wake)
            except RuntimeError:  # the loop has closed already
                pass

    # ---- the asyncio loop ---------------------------------------------------------------------------------
    def _wake(self) -> None:
        self._wake_pending.clear()
        for viewer in self._viewers:
            viewer.set()

    @property
    def viewers(self) -> int:
        return len(self._viewers)

    def newest(self) -> list[StepEvent]:
        return list(self._ring)

    def _record(self, event: StepEvent, skipped: list[StepEvent]) -> str:
        if skipped:
            return json.dumps(self.record(event, skipped), ensure_ascii=False, separators=(",", ":"))
        text = self._records.get(event.step)
        if text is None:
            text = json.dumps(self.record(event, []), ensure_ascii=False, separators=(",", ":"))
            self._records[event.step] = text
            oldest = self._ring[0].step if self._ring else event.step
            for step in [s for s in self._records if s < oldest]:
                del self._records[step]
        return text

    async def stream(self, radix: bool) -> AsyncIterator[str]:
        """One viewer's SSE lines: the steps held now, then new ones as they come, and the figures each second."""
        self._loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        self._viewers.add(wake)
        if radix:
            self._radix_viewers += 1
            if self._radix_viewers == 1 and self._report_radix is not None:
                self._report_radix(True)
        try:
            last = -1
            figures_at = 0.0
            yield "retry: 1000\n\n"
            while not self._closed:
                held = [e for e in list(self._ring) if e.step > last]
                if len(held) > CATCH_UP and last >= 0:
                    held = held[-1:]
                    skipped = [e for e in list(self._ring) if last < e.step < held[0].step]
                    yield f"event: step\ndata: {self._record(held[0], skipped)}\n\n"
                else:
                    for event in held:
                        yield f"event: step\ndata: {self._record(event, [])}\n\n"
                if held:
                    last = held[-1].step
                now = self._loop.time()
                if self.figures is not None and now - figures_at >= FIGURES_EVERY_S:
                    figures_at = now
                    yield f"event: figures\ndata: {json.dumps(self.figures())}\n\n"
                await asyncio.sleep(SEND_EVERY_S)
                if not self._ring or self._ring[-1].step <= last:
                    wake.clear()
                    try:
                        await asyncio.wait_for(wake.wait(), FIGURES_EVERY_S)
                    except asyncio.TimeoutError:
                        pass
        finally:
            self._viewers.discard(wake)
            if radix:
                self._radix_viewers -= 1
                if self._radix_viewers == 0 and self._report_radix is not None:
                    self._report_radix(False)
