"""GET routes that tell about the server: its model, its health, its metrics and its engine processes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from serving.api.deps import Bridge, check_model

router = APIRouter()


@router.get("/health")
async def health(bridge: Bridge) -> Any:
    if bridge.llm.dead is not None:
        return JSONResponse({"status": "engine dead", "error": bridge.llm.dead}, status_code=503)
    return {"status": "ok"}


@router.get("/engines")
async def engines(bridge: Bridge) -> dict[str, Any]:
    """The engine processes behind this server: their pids and the requests each was sent."""
    llm = bridge.llm
    return {"engines": [{"pid": pid, "requests": n, "tp_workers": workers}
                        for pid, n, workers in zip(llm.pids, llm.placed, llm.worker_pids)]}


@router.get("/v1/models")
async def models(bridge: Bridge) -> dict[str, Any]:
    return {"object": "list", "data": [bridge.info()]}


@router.get("/v1/models/{name:path}")
async def model(name: str, bridge: Bridge) -> dict[str, Any]:
    """One model by name (the openai client's ``models.retrieve``); a name may hold slashes."""
    check_model(bridge, name)
    return bridge.info()


@router.get("/metrics")
async def metrics(bridge: Bridge) -> PlainTextResponse:
    return PlainTextResponse(bridge.totals().render(bridge.gauges()), media_type="text/plain; version=0.0.4")
