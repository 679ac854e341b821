"""POST /v1/completions: one or several prompts (text or token ids), ``n`` choices each, gathered or streamed."""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import APIRouter, Request

from serving.api.calls import start_all
from serving.api.deps import Bridge, check_model
from serving.api.logprobs import completion_logprobs
from serving.api.prompt_ids import prompt_ids_of
from serving.api.protocol import CompletionRequest
from serving.api.responses import Piece, chunks, gather, stream, usage

router = APIRouter()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, bridge: Bridge) -> Any:
    check_model(bridge, body.model)
    prompts = [await prompt_ids_of(bridge.llm, prompt) for prompt in body.prompt_list()]
    call = start_all(bridge, prompts, body)
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": bridge.model_name}
    tokenizer = bridge.llm.tokenizer
    if body.stream:
        return stream(chunks(bridge, call, request, CompletionChunks(tokenizer, len(call.tracked)), body, head))
    got = await gather(bridge, call, request)
    return {**head, "choices": [{"index": index, "text": "".join(choice.text),
                                 "logprobs": completion_logprobs(tokenizer, choice.logprobs, 0),
                                 "finish_reason": choice.finish_reason} for index, choice in enumerate(got)],
            "usage": usage(call.prompt_tokens, sum(len(choice.tokens) for choice in got))}


class CompletionChunks:
    """A streamed completion's chunks: each choice's text, with its logprobs' offsets into the text so far."""

    def __init__(self, tokenizer: Any, choices: int) -> None:
        self.tokenizer = tokenizer
        self.offsets = [0] * choices

    def __call__(self, piece: Piece, first: bool, index: int) -> dict[str, Any] | None:
        if not piece.text and not piece.entries and not piece.finished:
            return None
        logprobs = completion_logprobs(self.tokenizer, piece.entries, self.offsets[index])
        self.offsets[index] += sum(len(t) for t in (logprobs or {}).get("tokens", []))
        return {"choices": [{"index": index, "text": piece.text, "logprobs": logprobs,
                             "finish_reason": piece.finish_reason if piece.finished else None}]}
