"""The live dashboard put together, for ``serve --dashboard`` and ``trace --web``: the page and each step's record
from render/ (render/dashboard_page.py), the ring of steps and the routes that serve them from serving/
(serving/api/dashboard.py, serving/api/routes/dashboard.py), which never imports the views."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.events import StepEvent
from render.dashboard_page import CSP, Facts, dashboard_html, dashboard_record
from serving.api.dashboard import HISTORY, StepRing
from serving.api.routes.dashboard import Dashboard, add_dashboard


def add_live_dashboard(app: Any, facts: Facts, show_text: bool, model: str, options: dict[str, Any], *,
                       history: int = HISTORY, decode: Callable[[list[int]], str] | None = None,
                       report_radix: Callable[[bool], None] | None = None,
                       figures: Callable[[], dict[str, Any]] | None = None) -> StepRing:
    """/dashboard and /dashboard/events on ``app``; the ring they read, for the step events to be added to."""

    def record(event: StepEvent, skipped: list[StepEvent]) -> dict[str, Any]:
        return dashboard_record(event, facts, show_text, decode, skipped)

    ring = StepRing(record, history=history, report_radix=report_radix, figures=figures)
    page = dashboard_html(model, options, show_text, history, events_url="/dashboard/events")
    add_dashboard(app, Dashboard(ring, page, CSP))
    return ring
