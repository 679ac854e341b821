"""The limits a connection is held to, in uvicorn's httptools protocol (limits.py says why they are here): the
time to send a request, the bytes of its request line and headers, the connections open at once; and what
the HTTP parser refuses, answered in OpenAI's shape. Each refusal is written as the whole response, unless
one has begun, and closes the connection."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any, Callable

from fastapi.responses import JSONResponse
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serving.api.limits import CLOSE, Limits
from serving.api.protocol import ApiError

MAX_HEAD_BYTES = 64 * 1024  # the request line and headers; a real client's are under 8 KiB
BAD_HTTP = ApiError(400, "the request is not valid HTTP/1.1", code="bad_http")
HEAD_TOO_LARGE = ApiError(431, f"the request line and headers are over {MAX_HEAD_BYTES:,} bytes",
                          code="headers_too_large")


class HeadTooLarge(Exception):
    pass


def raw_response(error: ApiError) -> bytes:
    """A whole HTTP/1.1 response for ``error``, written straight to a connection the app never saw."""
    body = json.dumps(error.body()).encode()
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body)), **CLOSE, **error.headers}
    head = f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
    return head.encode("latin-1") + body


def limited_protocol(limits: Limits, refused: Callable[[int], None]) -> type:
    """The protocol class for uvicorn's ``http``; ``refused`` hears each refusal's status (for /metrics)."""
    too_many = ApiError(503, f"the server has {limits.max_connections} connections open, its limit "
                             f"(--max-connections); retry later", kind="server_overloaded",
                        code="too_many_connections", headers={**CLOSE, "Retry-After": "1"})
    too_slow = ApiError(408, f"the request was not sent whole within {limits.read_timeout_s:g} s (--read-timeout)",
                        code="request_timeout")
    return type("LimitedHttp", (LimitedHttp,), {"limits": limits, "refused": staticmethod(refused),
                                                "too_many": too_many, "too_slow": too_slow})


class LimitedHttp(HttpToolsProtocol):
    limits: Limits
    refused: Callable[[int], None]
    too_many: ApiError
    too_slow: ApiError

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.read_timer: Any = self.loop.call_later(self.limits.read_timeout_s, self.read_timed_out)
        self.head_bytes: int | None = 0  # read of the request whose headers are being read; None once they are
        self.head_parsed = 0  # of those, handed over by the parser
        self.finished = 0  # requests read whole on this connection

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_read_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        finished = self.finished
        super().data_received(data)
        if self.head_bytes is not None and self.finished == finished:  # all of it before the headers' end
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES:
                self.refuse(HEAD_TOO_LARGE)

    def on_message_begin(self) -> None:
        self.head_parsed = 0
        super().on_message_begin()
        self.head_bytes = self.head_bytes or 0
        if self.read_timer is None:
            self.read_timer = self.loop.call_later(self.limits.read_timeout_s, self.read_timed_out)

    def on_url(self, url: bytes) -> None:
        self.count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.count_head(len(name) + len(value))
        super().on_header(name, value)

    def count_head(self, n: int) -> None:
        """The parser hands a header over whole, also one that came in a single read: counted here too."""
        self.head_parsed += n
        if self.head_parsed > MAX_HEAD_BYTES:
            raise HeadTooLarge()  # out of the parser, which answers with send_400_response

    def on_headers_complete(self) -> None:
        self.head_bytes = None
        if len(self.connections) <= self.limits.max_connections:
            super().on_headers_complete()
            return
        app, self.app = self.app, self.refuse_connection
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    async def refuse_connection(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The app a request on a connection beyond the limit gets: a 503 that closes it."""
        self.refused(self.too_many.status)
        error = self.too_many
        await JSONResponse(error.body(), status_code=error.status, headers=error.headers)(scope, receive, send)

    def on_message_complete(self) -> None:
        self.stop_read_timer()
        self.head_bytes = 0
        self.finished += 1
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        """What the HTTP parser refuses (a header with a bare CR or LF, a malformed request line), in OpenAI's
        shape rather than uvicorn's plain text; nothing of the request is echoed."""
        self.refuse(HEAD_TOO_LARGE if self.head_parsed > MAX_HEAD_BYTES else BAD_HTTP)

    def stop_read_timer(self) -> None:
        if getattr(self, "read_timer", None) is not None:
            self.read_timer.cancel()
            self.read_timer = None

    def read_timed_out(self) -> None:
        self.read_timer = None
        self.refuse(self.too_slow)

    def refuse(self, error: ApiError) -> None:
        if self.transport.is_closing():
            return
        cycle = self.cycle  # the request being read, or the one before it, answered and read whole
        if cycle is None or not cycle.response_started or (cycle.response_complete and not cycle.more_body):
            self.refused(error.status)
            self.transport.write(raw_response(error))
        self.transport.close()
