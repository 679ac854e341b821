"""Every response names its request (``X-Request-Id``), and ``serve --log-requests`` writes one line per API request.

A client, or a proxy in front of the server, that sends ``X-Request-Id`` gets the same id back, so its logs and
the server's join on it; without one (or with one that is not a short run of visible ASCII) the server makes one.
The openai client shows it as ``response._request_id`` and ``APIError.request_id``. Errors carry it too: the
middleware is outermost, around the API key check.

The log line is written when the response has ended (a stream's last byte sent): the request's id, the client, the
method and path, the status, then what the handler learned (the engine's uid, which ``--trace-out``'s step events
name, and the finish reason, for each choice; the prompt and completion tokens; the time to the first token and in
all; an error's message). It never holds the prompt or the completion. Only the API's paths are logged (/v1/,
/tokenize, /detokenize): health probes, metric scrapes and the dashboard's stream would drown the requests.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from serving.api.protocol import API_PATHS

ID_HEADER = b"x-request-id"
MAX_ID_BYTES = 128


@dataclass
class RequestRecord:
    """One API request as its log line tells it; the handler fills in what it learns."""

    request_id: str
    started: float  # time.perf_counter() when the request reached the server
    uids: list[int] | None = None  # the engine's, a choice each
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reasons: list[str] | None = None  # a choice each
    first_token_at: float | None = None  # time.perf_counter()
    error: str | None = None


def request_id_of(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's id when it sent a usable one, else a new one."""
    sent = next((value for name, value in headers if name == ID_HEADER), b"")
    if 0 < len(sent) <= MAX_ID_BYTES and all(0x21 <= byte <= 0x7E for byte in sent):
        return sent.decode("ascii")
    return f"req-{uuid.uuid4().hex}"


def log_line(record: RequestRecord, scope: dict[str, Any], status: int, ended: float) -> str:
    client = scope.get("client")
    fields = [datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
              record.request_id, client[0] if client else "-", scope["method"], scope["path"], str(status)]
    named = {"uid": joined(record.uids), "prompt_tokens": record.prompt_tokens,
             "completion_tokens": record.completion_tokens, "finish_reason": joined(record.finish_reasons),
             "ttft_ms": milliseconds(record.started, record.first_token_at),
             "total_ms": milliseconds(record.started, ended)}
    fields += [f"{name}={value}" for name, value in named.items() if value is not None]
    if record.error is not None:
        fields.append(f"error={json.dumps(record.error, ensure_ascii=False)}")
    return " ".join(fields)


def joined(values: list[Any] | None) -> str | None:
    """A choice's value, or every choice's, comma-separated."""
    return None if values is None else ",".join(str(value) for value in values)


def milliseconds(start: float, end: float | None) -> str | None:
    return None if end is None else f"{(end - start) * 1e3:.1f}"


class RequestIds:
    """An ASGI middleware: the request's id into ``request.state.record`` and onto the response's headers; with
    ``log``, each /v1/ request's line once its response has ended."""

    def __init__(self, app: Any, log: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestRecord(request_id_of(scope["headers"]), time.perf_counter())
        scope = {**scope, "state": {**scope.get("state", {}), "record": record}}
        header = (ID_HEADER, record.request_id.encode("ascii"))
        status = 500  # what the client sees if the app fails before it answers

        async def send_with_id(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if self.log is not None and scope["path"].startswith(API_PATHS):
                self.log(log_line(record, scope, status, time.perf_counter()))


def record_of(request: Any) -> RequestRecord:
    """The request's log record, put there by the RequestIds middleware."""
    return request.state.record
