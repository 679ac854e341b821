"""The FastAPI application: OpenAI's completions and chat endpoints, models, health and metrics.

A handler checks the request (400, 404), submits it through the bridge, one engine request per choice (every
prompt's ``n``), their replies into one queue (400 for a prompt that can never run, 503 when the queue is full),
and then either gathers the replies into one response or streams them as server-sent events, ``data: {chunk}``
lines ending in ``data: [DONE]``. Whichever way a response ends early (the client disconnects, the server shuts
down), its requests are aborted so their pages come back.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from core.errors import InvalidParamsError
from core.scheduler.reply import Reply
from serving.api.auth import RequireApiKey
from serving.api.bridge import EngineBridge, Tracked
from serving.api.protocol import (ApiError, ChatRequest, CompletionRequest, DetokenizeRequest, Message,
                                        TokenizeRequest, template_messages)
from serving.api.request_log import RequestIds, RequestRecord


class ClientGone(Exception):
    pass


@dataclass
class Piece:
    """Every reply of one request that was ready at once, as one chunk: a client that reads slower than tokens
    come gets all the text that is ready in its next chunk, not one chunk per token."""

    text: str = ""
    tokens: int = 0  # completion tokens (an EOS that ended the request is not one)
    entries: list[Reply] = field(default_factory=list)  # the replies that carry logprobs
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None


@dataclass
class Call:
    """One HTTP request's engine requests, a choice each (every prompt's ``n`` choices, in order), and the one
    queue their replies come into."""

    tracked: list[Tracked]
    queue: asyncio.Queue
    prompt_tokens: int  # each prompt counted once, however many choices it has

    def __post_init__(self) -> None:
        self.index = {tracked.uid: i for i, tracked in enumerate(self.tracked)}

    @property
    def uids(self) -> list[int]:
        return [tracked.uid for tracked in self.tracked]

    def by_choice(self, ready: list[Reply]) -> list[tuple[int, list[Reply]]]:
        """The ready replies grouped by choice, each group in arrival order."""
        if len(self.tracked) == 1:  # the usual request: nothing to group
            return [(0, ready)]
        groups: dict[int, list[Reply]] = {}
        for reply in ready:
            groups.setdefault(self.index[reply.uid], []).append(reply)
        return list(groups.items())


@dataclass
class Gathered:
    """A whole response's worth of replies."""

    text: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[Reply] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None


def create_app(bridge: EngineBridge, api_key: str | None = None,
               log_request: Callable[[str], None] | None = None, allow_origins: list[str] | None = None) -> FastAPI:
    """The app; with ``api_key``, everything under /v1/ answers only a client that sends it (auth.py);
    every response carries its request's id, and ``log_request`` hears each API request's line
    (request_log.py); pages from ``allow_origins`` may call it from a browser (CORS)."""
    app = FastAPI(title="minisgl", docs_url=None, redoc_url=None)
    llm = bridge.llm
    tokenizer = llm.tokenizer
    eos = llm.eos_token_ids

    def error_response(request: Request, error: ApiError) -> JSONResponse:
        bridge.metrics.rejected_with(error.status)
        record_of(request).error = error.message
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(request, validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def no_such_route(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """An unknown path or method, in OpenAI's shape like every other error (not FastAPI's ``detail``)."""
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            message = (f"no route {where}; this server answers POST /v1/completions, POST /v1/chat/completions, "
                       f"GET /v1/models[/NAME], POST /tokenize, POST /detokenize, GET /health and GET /metrics")
        elif exc.status_code == 405:
            allowed = {name.lower(): value for name, value in (exc.headers or {}).items()}.get("allow")
            message = f"method {request.method} is not allowed on {request.url.path}" + (f"; use {allowed}"
                                                                                          if allowed else "")
        else:
            message = f"{where}: {exc.detail}"
        return error_response(request, ApiError(exc.status_code, message, headers=dict(exc.headers or {})))

    app.add_middleware(JsonByDefault)
    if api_key is not None:
        app.add_middleware(RequireApiKey, key=api_key, refused=bridge.metrics.rejected_with)
    if allow_origins:  # outside the key check: a browser's preflight carries no key, and a 401 must be readable
        app.add_middleware(CORSMiddleware, allow_origins=allow_origins, allow_methods=["GET", "POST"],
                           allow_headers=["*"], expose_headers=["X-Request-Id"], max_age=600)
    app.add_middleware(RequestIds, log=log_request)  # the last added runs first: every response gets the id

    @app.get("/health")
    async def health() -> Any:
        if bridge.llm.dead is not None:
            return JSONResponse({"status": "engine dead", "error": bridge.llm.dead}, status_code=503)
        return {"status": "ok"}

    @app.get("/engines")
    async def engines() -> dict[str, Any]:
        """The engine processes behind this server: their pids and the requests each was sent."""
        llm = bridge.llm
        return {"engines": [{"pid": pid, "requests": n, "tp_workers": workers}
                            for pid, n, workers in zip(llm.pids, llm.placed, llm.worker_pids)]}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [bridge.info()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> dict[str, Any]:
        """One model by name (the openai client's ``models.retrieve``); a name may hold slashes."""
        check_model(name)
        return bridge.info()

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(bridge.metrics.render(bridge.gauges()), media_type="text/plain; version=0.0.4")

    def check_model(name: str) -> None:
        if name != bridge.model_name:
            raise ApiError(404, f"the model '{name}' does not exist; this server serves '{bridge.model_name}'",
                           param="model", code="model_not_found")

    def token_text(token: int) -> str:
        return tokenizer.decode([token], skip_special_tokens=False)

    def start_all(prompts: list[list[int]], body: CompletionRequest | ChatRequest) -> Call:
        """Every choice of every prompt submitted, their replies into one queue; if one is refused (a prompt too
        long, a full queue), those already started are aborted and the refusal stands for the whole request."""
        wanted = len(prompts) * body.n
        if bridge.max_queue is not None and wanted > bridge.max_queue:  # a 503 would say retry, in vain
            raise ApiError(400, f"this request asks for {wanted} choices (prompts x n); the server queues at most "
                                f"{bridge.max_queue} requests (--max-queue)", param="n")
        queue: asyncio.Queue = asyncio.Queue()
        started: list[Tracked] = []
        try:
            for ids in prompts:  # a prompt's choices, unset max_tokens what its length leaves
                started += [bridge.start(ids, params, queue)
                            for params in body.choice_params(bridge.default_max_tokens(len(ids)))]
        except ApiError:
            for tracked in started:
                bridge.abort(tracked)
            raise
        return Call(started, queue, sum(len(ids) for ids in prompts))

    async def replies(call: Call, request: Request) -> AsyncIterator[list[Reply]]:
        """The replies of the request's choices as they come, every one ready at once together, until each choice
        has its final one; a vanished client aborts them all. A task beside it waits for the disconnect and wakes
        it, streamed or not and however often tokens come, so waiting for a reply is a plain wait on the queue
        (no timer per reply)."""
        watch = asyncio.create_task(wake_on_disconnect(request, call.queue))
        open_choices = len(call.tracked)
        try:
            while open_choices:
                ready = [await call.queue.get()]
                while not call.queue.empty():
                    ready.append(call.queue.get_nowait())
                for reply in ready:
                    if reply is None:
                        raise ClientGone()
                    open_choices -= reply.finished
                yield ready
        finally:  # also on cancellation, a failed send, or the generator closed half way
            watch.cancel()
            for tracked in call.tracked:
                bridge.abort(tracked)
            record = record_of(request)
            record.uids, record.prompt_tokens = call.uids, call.prompt_tokens
            record.finish_reasons = [t.finish_reason if t.finished else "abort" for t in call.tracked]
            record.first_token_at = min((t.first_token_at for t in call.tracked if t.first_token_at), default=None)

    async def wake_on_disconnect(request: Request, queue: asyncio.Queue) -> None:
        """Once the client has gone, a None in the request's queue wakes its reader. The body has been read,
        so the server's next message is the disconnect."""
        while (await request.receive())["type"] != "http.disconnect":
            pass
        queue.put_nowait(None)

    def piece_of(ready: list[Reply]) -> Piece:
        piece = Piece()
        texts = []
        for reply in ready:
            if completion_token(reply):
                piece.tokens += 1
            if reply.logprob is not None and reply.token not in eos:
                piece.entries.append(reply)
            texts.append(reply.text or "")
        piece.text = "".join(texts)
        last = ready[-1]
        piece.finished, piece.finish_reason, piece.error = last.finished, last.finish_reason, last.error
        return piece

    async def gather(call: Call, request: Request) -> list[Gathered]:
        """Each choice's whole answer, in the choices' order."""
        got = [Gathered() for _ in call.tracked]
        try:
            async for ready in replies(call, request):
                for reply in ready:
                    add_reply(got[call.index[reply.uid]], reply)
        except ClientGone:  # no one reads the answer now
            pass
        record_of(request).completion_tokens = sum(len(choice.tokens) for choice in got)
        return got

    def add_reply(got: Gathered, reply: Reply) -> None:
        if completion_token(reply):
            got.tokens.append(reply.token)
            if reply.logprob is not None:
                got.logprobs.append(reply)
        got.text.append(reply.text or "")
        if reply.finished:
            got.finish_reason, got.error = reply.finish_reason, reply.error

    def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    def completion_logprobs(entries: list[Reply], offset: int) -> dict[str, Any] | None:
        if not entries:
            return None
        tokens = [token_text(r.token) for r in entries]
        offsets = []
        for text in tokens:
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": [r.logprob for r in entries],
                "top_logprobs": [top_dict(r) for r in entries],
                "text_offset": offsets}

    def top_dict(reply: Reply) -> dict[str, float]:
        """Completions key the alternatives by text; tokens that decode alike keep the likeliest one's value."""
        out: dict[str, float] = {}
        for token, logprob in reply.top_logprobs or ():
            out.setdefault(token_text(token), logprob)
        return out

    def chat_logprobs(entries: list[Reply]) -> dict[str, Any] | None:
        def item(token: int, logprob: float) -> dict[str, Any]:
            text = token_text(token)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

        if not entries:
            return None
        return {"content": [{**item(r.token, r.logprob),
                             "top_logprobs": [item(t, lp) for t, lp in r.top_logprobs or ()]} for r in entries]}

    def completion_token(reply: Reply) -> bool:
        """A token the completion counts: any but the EOS that ended it."""
        return reply.token is not None and not (reply.finish_reason == "stop" and reply.token in eos)

    def failure(error: str | None) -> ApiError:
        """A request answered with an error: the client's fault (400) unless the engine failed (500)."""
        engine_gone = error is None or bridge.llm.dead is not None
        return ApiError(500 if engine_gone else 400, error or "the request failed",
                        kind="server_error" if engine_gone else "invalid_request_error")

    def ended_badly(got: list[Gathered]) -> None:
        for choice in got:
            if choice.finish_reason == "error":
                raise failure(choice.error)

    async def prompt_ids_of(prompt: str | list[int]) -> list[int]:
        """A text prompt is tokenized on a worker thread: the tokenizer lets go of the interpreter lock, so the
        loop goes on streaming to everyone else however long the text (token ids are only checked, here)."""
        return await asyncio.to_thread(token_ids, prompt) if isinstance(prompt, str) else token_ids(prompt)

    def token_ids(prompt: str | list[int]) -> list[int]:
        try:
            return llm.tokenize(prompt)
        except InvalidParamsError as exc:
            raise ApiError(400, str(exc), param="prompt") from None

    async def chat_ids_of(messages: list[Message], add_generation_prompt: bool = True) -> list[int]:
        """The template and its tokenizing on a worker thread, as a text prompt's (prompt_ids_of)."""
        return await asyncio.to_thread(chat_ids, messages, add_generation_prompt)

    def chat_ids(messages: list[Message], add_generation_prompt: bool) -> list[int]:
        if not getattr(tokenizer, "chat_template", None):
            raise ApiError(400, "this model's tokenizer has no chat template; use /v1/completions",
                           param="messages")
        rendered = template_messages(messages)  # a part that cannot be read is refused here, naming its message
        try:
            ids = tokenizer.apply_chat_template(rendered, add_generation_prompt=add_generation_prompt, tokenize=True)
        except Exception as exc:  # a template that refuses these roles, say
            raise ApiError(400, f"the chat template refused these messages: {exc}", param="messages") from None
        if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def stream(events: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
        async def lines() -> AsyncIterator[str]:
            async for event in events:
                yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(lines(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def chunks(call: Call, request: Request, make: Callable[[Piece, bool, int], dict[str, Any] | None],
                     body: CompletionRequest | ChatRequest, head: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The stream's events: per batch of ready replies, a chunk for each choice that has news (made by
        ``make(piece, first, index)``), then as ``stream_options`` asks the counts (also in every chunk)."""
        every_chunk = body.usage_in_every_chunk
        completion_tokens = 0
        first = [True] * len(call.tracked)
        record = record_of(request)
        try:
            async for ready in replies(call, request):
                for index, ready_of_choice in call.by_choice(ready):
                    piece = piece_of(ready_of_choice)
                    completion_tokens += piece.tokens
                    if piece.finished and piece.finish_reason == "error":
                        error = failure(piece.error)
                        record.error = error.message
                        yield {"error": error.body()["error"]}
                        return
                    chunk = make(piece, first[index], index)
                    first[index] = False
                    if chunk is not None:
                        yield ({**head, **chunk, "usage": usage(call.prompt_tokens, completion_tokens)} if every_chunk
                               else {**head, **chunk})
        except ClientGone:
            return
        finally:
            record.completion_tokens = completion_tokens
        if body.include_usage:
            yield {**head, "choices": [], "usage": usage(call.prompt_tokens, completion_tokens)}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        check_model(body.model)
        prompts = [await prompt_ids_of(prompt) for prompt in body.prompt_list()]
        call = start_all(prompts, body)
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": bridge.model_name}
        if body.stream:
            offsets = [0] * len(call.tracked)

            def make(piece: Piece, _: bool, index: int) -> dict[str, Any] | None:
                if not piece.text and not piece.entries and not piece.finished:
                    return None
                logprobs = completion_logprobs(piece.entries, offsets[index])
                offsets[index] += sum(len(t) for t in (logprobs or {}).get("tokens", []))
                return {"choices": [{"index": index, "text": piece.text, "logprobs": logprobs,
                                     "finish_reason": piece.finish_reason if piece.finished else None}]}

            return stream(chunks(call, request, make, body, head))
        got = await gather(call, request)
        ended_badly(got)
        return {**head, "choices": [{"index": index, "text": "".join(choice.text),
                                     "logprobs": completion_logprobs(choice.logprobs, 0),
                                     "finish_reason": choice.finish_reason} for index, choice in enumerate(got)],
                "usage": usage(call.prompt_tokens, sum(len(choice.tokens) for choice in got))}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Any:
        check_model(body.model)
        ids = await chat_ids_of(body.messages)
        call = start_all([ids], body)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": bridge.model_name}
        if body.stream:
            def make(piece: Piece, first: bool, index: int) -> dict[str, Any] | None:
                text = piece.text
                if not (first or text or piece.entries or piece.finished):
                    return None
                delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {}
                if text:
                    delta["content"] = text
                return {"choices": [{"index": index, "delta": delta, "logprobs": chat_logprobs(piece.entries),
                                     "finish_reason": piece.finish_reason if piece.finished else None}]}

            return stream(chunks(call, request, make, body, head))
        got = await gather(call, request)
        ended_badly(got)
        return {**head, "object": "chat.completion",
                "choices": [{"index": index, "message": {"role": "assistant", "content": "".join(choice.text)},
                             "logprobs": chat_logprobs(choice.logprobs), "finish_reason": choice.finish_reason}
                            for index, choice in enumerate(got)],
                "usage": usage(call.prompt_tokens, sum(len(choice.tokens) for choice in got))}

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        """A prompt's token ids, as /v1/completions (a prompt) or /v1/chat/completions (messages) would send it."""
        check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise ApiError(400, "give 'prompt' or 'messages', one of the two", param="prompt")
        ids = (await prompt_ids_of(body.prompt) if body.prompt is not None
               else await chat_ids_of(body.messages, body.add_generation_prompt))
        return {"count": len(ids), "max_model_len": llm.max_seq_len, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        check_model(body.model)
        outside = next((t for t in body.tokens if not 0 <= t < len(tokenizer)), None)
        if outside is not None:
            raise ApiError(400, f"token id {outside} is outside the tokenizer's vocabulary [0, {len(tokenizer)})",
                           param="tokens")
        return {"prompt": await asyncio.to_thread(tokenizer.decode, body.tokens)}

    return app


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


def record_of(request: Request) -> RequestRecord:
    """The request's log record, put there by the RequestIds middleware."""
    return request.state.record


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
    return ApiError(400, f"'{path}': {first.get('msg', 'invalid value')}", param=path or None)
