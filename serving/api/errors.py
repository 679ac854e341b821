"""Every error in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: an ``ApiError`` a handler
raises, a body FastAPI could not validate (one message naming the first field), an unknown path or method.
Each is counted in /metrics (``http_errors_total``) and written on the request's log line."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from serving.api.deps import bridge_of
from serving.api.protocol import ApiError
from serving.api.request_log import record_of

ROUTES = ("POST /v1/completions, POST /v1/chat/completions, GET /v1/models[/NAME], POST /tokenize, POST /detokenize, "
          "GET /health and GET /metrics")


def add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, bad_request)
    app.add_exception_handler(StarletteHTTPException, no_such_route)


def error_response(request: Request, error: ApiError) -> JSONResponse:
    bridge_of(request).metrics.rejected_with(error.status)
    record_of(request).error = error.message
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(request, exc)


async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(request, validation_error(exc))


async def no_such_route(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """An unknown path or method, in OpenAI's shape like every other error (not FastAPI's ``detail``)."""
    path = request.url.path
    where = f"{request.method} {path if len(path) <= 200 else path[:200] + '...'}"
    if exc.status_code == 404 and (path == "/dashboard" or path.startswith("/dashboard/")) and \
            getattr(request.app.state, "dashboard", None) is None:
        message = "the dashboard is off: start the server with --dashboard to serve it at /dashboard"
    elif exc.status_code == 404:
        message = f"no route {where}; this server answers {ROUTES}"
    elif exc.status_code == 413:  # the body, read as it came, passed --max-body-bytes (limits.py)
        return error_response(request, ApiError(413, str(exc.detail), code="request_too_large",
                                                headers=dict(exc.headers or {})))
    elif exc.status_code == 405:
        allowed = {name.lower(): value for name, value in (exc.headers or {}).items()}.get("allow")
        message = f"method {request.method} is not allowed on {path}" + (f"; use {allowed}"
                                                                                      if allowed else "")
    elif exc.status_code == 400 and isinstance(exc.__cause__, (UnicodeDecodeError, RecursionError)):
        message = ("the request body is not valid UTF-8" if isinstance(exc.__cause__, UnicodeDecodeError) else
                   "the request body's JSON is nested too deeply")
    else:
        message = f"{where}: {exc.detail}"
    return error_response(request, ApiError(exc.status_code, message, headers=dict(exc.headers or {})))


def validation_error(exc: RequestValidationError) -> ApiError:
    """FastAPI's list of problems as one OpenAI error naming the first field (or saying the JSON is bad)."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return ApiError(400, f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}".strip())
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    # a union's failures name each member type after the field: keep the field's own path
    path = ".".join(p for p in loc if not p[:1].isupper() and p not in ("str", "int", "list[int]", "list[str]"))
    if first.get("type") == "extra_forbidden":
        return ApiError(400, f"unknown field '{path}'", param=path)
    if first.get("type") == "missing" and not path:
        return ApiError(400, "the request body is empty; it must be a JSON object")
    if first.get("type") == "missing":
        return ApiError(400, f"'{path}' is required", param=path or None)
    if first.get("type") == "model_attributes_type" and not path:
        if isinstance(first.get("input"), (bytes, str)):  # a body that was not read as JSON: its type said otherwise
            return ApiError(400, "the request body must be a JSON object, sent with Content-Type: application/json")
        return ApiError(400, "the request body must be a JSON object")
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return ApiError(400, f"'{path}': {message}", param=path or None)
