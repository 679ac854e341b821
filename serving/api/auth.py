"""``serve --api-key``: the OpenAI endpoints answer only a client that sends the key, as OpenAI's own API does.

Clients send it as ``Authorization: Bearer KEY`` (the openai package's ``api_key``). Everything under /v1/ is
guarded, unknown paths there included, and /tokenize and /detokenize (a 401 says nothing about what exists);
/health, /metrics, /engines and /dashboard stay open for probes, scrapers and a browser, which cannot add the header
to a page's event stream. The key is compared in constant time, and a refusal never echoes what was sent.
"""

from __future__ import annotations

import secrets
from typing import Any, Callable

from fastapi.responses import JSONResponse

from serving.api.protocol import API_PATHS, ApiError



def bearer_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The token of an ``Authorization: Bearer ...`` header, as sent, or None without one."""
    value = next((v for name, v in headers if name == b"authorization"), None)
    if value is None:
        return None
    scheme, _, token = value.strip().partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else None


def refusal(token: bytes | None) -> ApiError:
    headers = {"WWW-Authenticate": "Bearer"}
    if token is None:
        return ApiError(401, "no API key: this server wants one, sent as 'Authorization: Bearer KEY' (the openai "
                             "client's api_key)", code="invalid_api_key", headers=headers)
    return ApiError(401, "incorrect API key", code="invalid_api_key", headers=headers)


class RequireApiKey:
    """An ASGI middleware: a request under /v1/ without the key gets a 401 in OpenAI's error shape; ``refused``
    hears each refusal's status (for /metrics)."""

    def __init__(self, app: Any, key: str, refused: Callable[[int], None]) -> None:
        self.app = app
        self.key = key.encode()
        self.refused = refused

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(API_PATHS):
            token = bearer_token(scope["headers"])
            if token is None or not secrets.compare_digest(token, self.key):
                error = refusal(token)
                self.refused(error.status)
                await JSONResponse(error.body(), status_code=error.status, headers=error.headers)(scope, receive,
                                                                                                  send)
                return
        await self.app(scope, receive, send)
