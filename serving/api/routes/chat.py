"""POST /v1/chat/completions: messages through the model's chat template, ``n`` choices, gathered or streamed;
with ``tools``, the calls read from each reply (serving/api/tools.py)."""

from __future__ import annotations

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
from serving.api.tools import ToolMode

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat(body: ChatRequest, request: Request, bridge: Bridge) -> Any:
    check_model(bridge, body.model)
    tokenizer = bridge.llm.tokenizer
    mode = body.read_tools(getattr(tokenizer, "chat_template", None))
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
    ids = await chat_ids_of(tokenizer, body.messages, tools=tools)
    call = start_all(bridge, [ids], body)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": bridge.model_name}
    if body.stream:
        return stream(chunks(bridge, call, request, ChatChunks(tokenizer, mode, len(call.tracked)), body, head))
    got = await gather(bridge, call, request)
    choices = []
    for index, choice in enumerate(got):
        message, finish_reason = mode.message("".join(choice.text), choice.finish_reason)
        choices.append({"index": index, "message": message, "logprobs": chat_logprobs(tokenizer, choice.logprobs),
                        "finish_reason": finish_reason})
    return {**head, "object": "chat.completion", "choices": choices,
            "usage": usage(call.prompt_tokens, sum(len(choice.tokens) for choice in got))}


class ChatChunks:
    """A streamed chat's chunks for each choice: the first carries the role, later ones only what is new. Where a
    tool call may begin, the text is held back until the choice ends; then its calls come as one delta each (the
    openai client joins a call's deltas by their index), or the held text if no call can be read."""

    def __init__(self, tokenizer: Any, mode: ToolMode, choices: int) -> None:
        self.tokenizer, self.mode = tokenizer, mode
        self.held = [""] * choices

    def __call__(self, piece: Piece, first: bool, index: int) -> dict[str, Any] | None:
        text, finish_reason = self.held[index] + piece.text, piece.finish_reason if piece.finished else None
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        at = self.mode.holds_from(text)
        if piece.finished and at is not None:  # the end: the held text's calls, if it has any
            message, finish_reason = self.mode.message(text[at:], finish_reason)
            text = text[:at] + (message["content"] or "")
            delta.update({"tool_calls": [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]}
                         if "tool_calls" in message else {})
        elif at is not None:
            text, self.held[index] = text[:at], text[at:]
        if text:
            delta["content"] = text
        if not (first or text or piece.entries or piece.finished):
            return None
        return {"choices": [{"index": index, "delta": delta, "logprobs": chat_logprobs(self.tokenizer, piece.entries),
                             "finish_reason": finish_reason}]}
