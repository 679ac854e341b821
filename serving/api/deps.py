"""What a route handler is given through FastAPI's dependencies: the bridge to the engine, which ``create_app``
puts on the app's state. A test can call a handler with a bridge of its own, or override ``engine_bridge``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from serving.api.bridge import EngineBridge
from serving.api.protocol import ApiError


def bridge_of(request: Request) -> EngineBridge:
    return request.app.state.bridge


async def engine_bridge(request: Request) -> EngineBridge:
    """A coroutine, not a plain function: FastAPI runs a plain dependency on a worker thread, a hop that every
    request would pay in latency and in the API process's CPU."""
    return bridge_of(request)


Bridge = Annotated[EngineBridge, Depends(engine_bridge)]


def check_model(bridge: EngineBridge, name: str) -> None:
    """A request names the model this server serves, or gets a 404 that names the right one."""
    if name != bridge.model_name:
        said = name if len(name) <= 200 else f"{name[:200]}...' ({len(name):,} characters)"
        raise ApiError(404, f"the model '{said}' does not exist; this server serves '{bridge.model_name}'",
                       param="model", code="model_not_found")
