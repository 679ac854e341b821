"""What a server open to strangers bounds (docs/RELIABILITY.md): a request body's size, the time a client takes to
send its request, the bytes of its request line and headers, and the connections open at once.

uvicorn bounds none of the first three, and answers its own connection limit (``limit_concurrency``) with a
plain-text 503 that counts the connection asking. So the HTTP protocol is uvicorn's httptools one with the limits
added (connection.py's ``limited_protocol``): a read timer from the connection's start, or a request's first byte,
to its last; a cap on the bytes before the headers end; a 503 in OpenAI's shape for a request on a connection
beyond the limit. The body's size is an ASGI middleware's (``BodyLimit``): a Content-Length over the limit is answered
before a byte of the body is read, a body without one is counted as it comes. Every refusal closes the
connection, so a client that sends too much is not read any further.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from starlette.exceptions import HTTPException

from serving.api.protocol import ApiError

CLOSE = {"Connection": "close"}


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 8 * 1024 * 1024
    read_timeout_s: float = 30.0
    max_connections: int = 1024


def body_too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is over this server's limit of {limit:,} bytes (--max-body-bytes)",
                    code="request_too_large", headers=CLOSE)


class BodyTooLarge(HTTPException):
    """Raised from the body's ``receive`` when the bytes read pass the limit; FastAPI lets an HTTPException out of
    its body reading, and the app's handler answers it (errors.py)."""

    def __init__(self, limit: int) -> None:
        error = body_too_large(limit)
        super().__init__(error.status, error.message, headers=error.headers)


def content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    value = next((v for name, v in headers if name == b"content-length"), None)
    return int(value) if value is not None and value.strip().isdigit() else None


class BodyLimit:
    """An ASGI middleware: a request whose body is over ``max_bytes`` gets a 413 in OpenAI's shape, at once when
    its Content-Length says so (its body never read), else when the bytes read pass the limit; ``refused``
    hears each refusal's status (for /metrics)."""

    def __init__(self, app: Any, max_bytes: int, refused: Callable[[int], None]) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.refused = refused

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = content_length(scope["headers"])
        if length is not None and length > self.max_bytes:
            from fastapi.responses import JSONResponse

            error = body_too_large(self.max_bytes)
            self.refused(error.status)
            scope["state"]["record"].error = error.message
            await JSONResponse(error.body(), status_code=error.status, headers=error.headers)(scope, receive, send)
            return
        read = 0

        async def counted() -> dict[str, Any]:
            nonlocal read
            message = await receive()
            read += len(message.get("body", b""))
            if read > self.max_bytes:
                raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted, send)
