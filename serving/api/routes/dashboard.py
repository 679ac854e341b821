"""GET /dashboard (the page) and GET /dashboard/events (its stream), with ``serve --dashboard`` and ``trace
--web``; nothing that changes the engine's work but whether step events carry the radix tree. The page is made
in render/ and handed in (``add_dashboard``), so serving/ never imports the views."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, StreamingResponse

from serving.api.dashboard import StepRing

router = APIRouter()


@dataclass(frozen=True)
class Dashboard:
    ring: StepRing
    page: str  # the page's HTML, which reads its stream at /dashboard/events
    csp: str  # the page's Content-Security-Policy


def add_dashboard(app: FastAPI, dashboard: Dashboard) -> None:
    app.state.dashboard = dashboard
    app.include_router(router)


def dashboard_of(request: Request) -> Dashboard:
    return request.app.state.dashboard


@router.get("/dashboard")
async def page(request: Request) -> HTMLResponse:
    headers = {"Content-Security-Policy": dashboard_of(request).csp, "Cache-Control": "no-store",
               "X-Content-Type-Options": "nosniff"}
    return HTMLResponse(dashboard_of(request).page, headers=headers)


@router.get("/dashboard/events")
async def events(request: Request, radix: int = 0) -> StreamingResponse:
    return StreamingResponse(dashboard_of(request).ring.stream(bool(radix)), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
