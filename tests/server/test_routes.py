"""Route handlers are module-level functions: each runs alone, on a stand-in for the bridge, without a server."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from serving.api.deps import check_model
from serving.api.protocol import ApiError
from serving.api.routes.info import health, models


def bridge(dead: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(llm=SimpleNamespace(dead=dead), model_name="tiny",
                           info=lambda: {"id": "tiny", "object": "model"})


def test_health_is_a_503_naming_why_once_the_engine_is_dead():
    assert asyncio.run(health(bridge())) == {"status": "ok"}
    reply = asyncio.run(health(bridge(dead="the engine process exited with code 9")))
    assert reply.status_code == 503
    assert json.loads(reply.body) == {"status": "engine dead", "error": "the engine process exited with code 9"}


def test_models_lists_the_one_model_and_another_name_is_a_404_naming_it():
    assert asyncio.run(models(bridge())) == {"object": "list", "data": [{"id": "tiny", "object": "model"}]}
    with pytest.raises(ApiError) as refused:
        check_model(bridge(), "gpt-4")
    assert refused.value.status == 404 and "this server serves 'tiny'" in refused.value.message


def test_no_route_or_dependency_runs_on_a_worker_thread():
    """FastAPI runs a plain (not async) handler or dependency on a worker thread: a hop each request pays in
    latency and in the API process's CPU. Every one of the API's is a coroutine function."""
    from serving.api.routes import ROUTERS
    from serving.api.routes.dashboard import router as dashboard_router

    def calls(dependant):
        yield dependant.call
        for dep in dependant.dependencies:
            yield from calls(dep)

    routes = [route for router in (*ROUTERS, dashboard_router) for route in router.routes]
    assert len(routes) >= 10
    plain = [f"{route.path}: {call.__name__}" for route in routes for call in calls(route.dependant)
             if not asyncio.iscoroutinefunction(call)]
    assert plain == []
