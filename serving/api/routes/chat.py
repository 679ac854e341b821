"""POST /v1/chat/completions: messages through the model's chat template, ``n`` choices, gathered or streamed."""

from __future__ import annotations

import functools
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request

from serving.api.calls import start_all
from serving.api.deps import Bridge, check_model
from serving.api.logprobs import chat_logprobs
from serving.api.prompt_ids import chat_ids_of
from serving.api.protocol import ChatRequest
from serving.api.responses import Piece, chunks, gather, stream, usage

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat(body: ChatRequest, request: Request, bridge: Bridge) -> Any:
    check_model(bridge, body.model)
    tokenizer = bridge.llm.tokenizer
    ids = await chat_ids_of(tokenizer, body.messages)
    call = start_all(bridge, [ids], body)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": bridge.model_name}
    if body.stream:
        return stream(chunks(bridge, call, request, functools.partial(chat_chunk, tokenizer), body, head))
    got = await gather(bridge, call, request)
    return {**head, "object": "chat.completion",
            "choices": [{"index": index, "message": {"role": "assistant", "content": "".join(choice.text)},
                         "logprobs": chat_logprobs(tokenizer, choice.logprobs), "finish_reason": choice.finish_reason}
                        for index, choice in enumerate(got)],
            "usage": usage(call.prompt_tokens, sum(len(choice.tokens) for choice in got))}


def chat_chunk(tokenizer: Any, piece: Piece, first: bool, index: int) -> dict[str, Any] | None:
    """A streamed chat's chunk for one choice: the first carries the role, later ones only what is new."""
    text = piece.text
    if not (first or text or piece.entries or piece.finished):
        return None
    delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {}
    if text:
        delta["content"] = text
    return {"choices": [{"index": index, "delta": delta, "logprobs": chat_logprobs(tokenizer, piece.entries),
                         "finish_reason": piece.finish_reason if piece.finished else None}]}
