"""ASGI middleware that reads the request before any route does."""

from __future__ import annotations

from typing import Any


class JsonByDefault:
    """A request body sent without a Content-Type, or with the form type that ``curl -d`` and urllib put on any
    body, is read as the JSON the API takes (a body that does not parse is then 'not valid JSON'); any other
    type is told to say application/json."""

    UNSAID = (b"", b"application/x-www-form-urlencoded")

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = [(name, value) for name, value in scope["headers"] if name != b"content-type"]
            said = next((value for name, value in scope["headers"] if name == b"content-type"), b"")
            if said.split(b";")[0].strip().lower() in self.UNSAID:
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)
