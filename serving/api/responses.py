"""A request's replies as its response: gathered into one JSON answer, or streamed as server-sent events,
``data: {chunk}`` lines ending in ``data: [DONE]``, a chunk per choice per batch of ready replies."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import StreamingResponse

from core.scheduler.reply import Reply
from serving.api.bridge import EngineBridge
from serving.api.calls import Call, ClientGone, failure, replies
from serving.api.protocol import ChatRequest, CompletionRequest
from serving.api.request_log import record_of


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


# a stream's chunk for one choice's piece: (piece, first of its choice, the choice's index) -> its fields, or None
MakeChunk = Callable[[Piece, bool, int], "dict[str, Any] | None"]


@dataclass
class Gathered:
    """A whole response's worth of replies."""

    text: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[Reply] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None


def completion_token(reply: Reply) -> bool:
    """A token the completion counts: any but the EOS or stop token id that ended it."""
    return reply.token is not None and not reply.ended_on_token


def piece_of(ready: list[Reply], eos: Collection[int]) -> Piece:
    piece = Piece()
    texts = []
    for reply in ready:
        if completion_token(reply):
            piece.tokens += 1
        if reply.logprob is not None and reply.token not in eos and not reply.ended_on_token:
            piece.entries.append(reply)
        texts.append(reply.text or "")
    piece.text = "".join(texts)
    last = ready[-1]
    piece.finished, piece.finish_reason, piece.error = last.finished, last.finish_reason, last.error
    return piece


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


async def gather(bridge: EngineBridge, call: Call, request: Request) -> list[Gathered]:
    """Each choice's whole answer, in the choices' order; a choice that ended in an error raises its 400 or 500."""
    got = [Gathered() for _ in call.tracked]
    try:
        async for ready in replies(bridge, call, request):
            for reply in ready:
                add_reply(got[call.index[reply.uid]], reply)
    except ClientGone:  # no one reads the answer now
        pass
    record_of(request).completion_tokens = sum(len(choice.tokens) for choice in got)
    for choice in got:
        if choice.finish_reason == "error":
            raise failure(bridge, choice.error)
    return got


def add_reply(got: Gathered, reply: Reply) -> None:
    if completion_token(reply):
        got.tokens.append(reply.token)
        if reply.logprob is not None:
            got.logprobs.append(reply)
    got.text.append(reply.text or "")
    if reply.finished:
        got.finish_reason, got.error = reply.finish_reason, reply.error


# characters that JSON may leave raw but that many line readers (Python's str.splitlines, httpx's iter_lines) end
# a line on: escaped, so that an event stays one line for them too. In UTF-8 these byte sequences are only ever
# these characters.
LINE_BREAKS = ((b"\xc2\x85", b"\\u0085"), (b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"))


def sse_line(event: dict[str, Any]) -> bytes:
    """One ``data:`` line of UTF-8 JSON. orjson writes the bytes directly, in a fraction of the time ``json.dumps``
    and an encode take: the API process does this once per token of every streamed request."""
    data = orjson.dumps(event)
    for raw, escaped in LINE_BREAKS:
        if raw in data:
            data = data.replace(raw, escaped)
    return b"data: " + data + b"\n\n"


def stream(events: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    async def lines() -> AsyncIterator[bytes]:
        async for event in events:
            yield sse_line(event)
        yield b"data: [DONE]\n\n"

    return StreamingResponse(lines(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def chunks(bridge: EngineBridge, call: Call, request: Request, make: MakeChunk,
                 body: CompletionRequest | ChatRequest, head: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """The stream's events: per batch of ready replies, a chunk for each choice that has news (made by
    ``make(piece, first, index)``), then as ``stream_options`` asks the counts (also in every chunk)."""
    every_chunk = body.usage_in_every_chunk
    eos = bridge.llm.eos_token_ids
    completion_tokens = 0
    first = [True] * len(call.tracked)
    record = record_of(request)
    try:
        async for ready in replies(bridge, call, request):
            for index, ready_of_choice in call.by_choice(ready):
                piece = piece_of(ready_of_choice, eos)
                completion_tokens += piece.tokens
                if piece.finished and piece.finish_reason == "error":
                    error = failure(bridge, piece.error)
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
