"""The FastAPI application: OpenAI's completions and chat endpoints, models, health and metrics.

The routes are routers, one module each under routes/; a handler reaches the engine through the bridge, a
dependency (deps.py) read from the app's state. A handler checks the request (400, 404), submits it through the
bridge, one engine request per choice (calls.py), and gathers the replies into one response or streams them as
server-sent events (responses.py). Every error is in OpenAI's shape (errors.py).
"""

from __future__ import annotations

from typing import Callable

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from serving.api.auth import RequireApiKey
from serving.api.bridge import EngineBridge
from serving.api.errors import add_error_handlers
from serving.api.limits import BodyLimit, Limits
from serving.api.middleware import JsonByDefault
from serving.api.request_log import RequestIds
from serving.api.routes import ROUTERS


def create_app(bridge: EngineBridge, api_key: str | None = None,
               log_request: Callable[[str], None] | None = None, allow_origins: list[str] | None = None,
               limits: Limits = Limits()) -> FastAPI:
    """The app; with ``api_key``, everything under /v1/ answers only a client that sends it (auth.py); every
    response carries its request's id, and ``log_request`` hears each API request's line (request_log.py); pages
    from ``allow_origins`` may call it from a browser (CORS); a body over ``limits.max_body_bytes`` is a 413
    (limits.py, whose protocol the server runs for the other limits)."""
    app = FastAPI(title="minisgl", docs_url=None, redoc_url=None)
    app.state.bridge = bridge
    add_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    app.add_middleware(JsonByDefault)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes, refused=bridge.metrics.rejected_with)
    if api_key is not None:
        app.add_middleware(RequireApiKey, key=api_key, refused=bridge.metrics.rejected_with)
    if allow_origins:  # outside the key check: a browser's preflight carries no key, and a 401 must be readable
        app.add_middleware(CORSMiddleware, allow_origins=allow_origins, allow_methods=["GET", "POST"],
                           allow_headers=["*"], expose_headers=["X-Request-Id"], max_age=600)
    app.add_middleware(RequestIds, log=log_request)  # the last added runs first: every response gets the id
    return app
