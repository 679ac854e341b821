"""``minisgl trace --web``: the offline run (or a saved trace, with ``--replay``) in the browser, on a local port.

The live run feeds the same page and stream as ``minisgl serve --dashboard`` (minisgl_cli/dashboard.py),
from the engine's step callbacks on this thread; the prompts are the user's own, so they are shown. A replay
serves the saved trace's replay page (render/html_replay.py), which plays it step by step. Either way the server
runs on a thread beside the run and keeps serving after it until Ctrl-C, so the run can still be looked at.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from core.events import StepEvent
from minisgl_cli.serve.listen import bind_listener
from render.trace_format import Trace

HISTORY = 2000  # steps the page keeps: a whole lesson-sized run


class WebServer:
    """uvicorn on a thread, on a socket bound now (a port in use fails before the model loads)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self._listener = bind_listener(host, port)
        self.port = self._listener.getsockname()[1]
        self._server: Any = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/dashboard"

    def start(self, app: Any) -> None:
        import uvicorn

        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        threading.Thread(target=self._server.run, kwargs={"sockets": [self._listener]}, name="minisgl-web",
                         daemon=True).start()

    def serve_until_interrupted(self, err: Console) -> None:
        while self._server is not None and not self._server.started:  # the URL it prints answers at once
            time.sleep(0.05)
        err.print(f"the page stays at {self.url} (Ctrl-C to stop)", highlight=False)
        try:
            while True:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        self._server.should_exit = True


def _app() -> Any:
    from fastapi import FastAPI

    return FastAPI(title="minisgl trace", docs_url=None, redoc_url=None, openapi_url=None)


class LiveRun:
    """A live run's facts for the page: each request's prompt and token counts, read from its step events."""

    def __init__(self, labels: list[str], model: str, options: dict[str, Any],
                 report_radix: Callable[[bool], None]) -> None:
        from minisgl_cli.dashboard import add_live_dashboard

        self.labels = labels
        self._prompt: dict[int, int] = {}
        self._generated: dict[int, int] = {}
        self._finish: dict[int, str] = {}
        self._text: dict[int, str] = {}
        self.app = _app()
        self.ring = add_live_dashboard(self.app, self.facts, True, model, options, history=HISTORY,
                                       report_radix=report_radix)

    def add(self, event: StepEvent) -> None:
        for r in event.reqs:
            if event.phase == "prefill":
                self._prompt[r.uid] = max(self._prompt.get(r.uid, 0), r.cached_len + r.extend_len)
            else:
                self._generated[r.uid] = self._generated.get(r.uid, 1) + 1
        for uid in event.finished:
            self._generated.setdefault(uid, 1)
        self.ring.add(event)

    def results(self, results: list[dict[str, Any]]) -> None:
        for uid, r in enumerate(results):  # in uid order
            self._generated[uid] = len(r["token_ids"])
            self._finish[uid] = r["finish_reason"]
            self._text[uid] = r.get("text") or ""
            if r.get("prompt_tokens"):
                self._prompt[uid] = r["prompt_tokens"]

    def facts(self, uid: int) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt_tokens": self._prompt.get(uid, 0),
                               "completion_tokens": self._generated.get(uid, 0),
                               "finish_reason": self._finish.get(uid)}
        if 0 <= uid < len(self.labels):
            out["prompt"] = self.labels[uid]
        if uid in self._text:
            out["completion"] = self._text[uid]
        return out


def replay_app(trace: Trace) -> Any:
    """The saved trace's replay page at /dashboard (and /)."""
    from fastapi.responses import HTMLResponse

    from render.html_replay import _CSP, html_replay

    app = _app()
    page = html_replay(trace)

    async def show() -> HTMLResponse:
        return HTMLResponse(page, headers={"Content-Security-Policy": _CSP, "Cache-Control": "no-store"})

    app.get("/dashboard")(show)
    app.get("/")(show)
    return app
