"""POST /tokenize and /detokenize: a prompt's token ids as the generating endpoints would send them, and back."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter

from serving.api.deps import Bridge, check_model
from serving.api.prompt_ids import chat_ids_of, prompt_ids_of
from serving.api.protocol import ApiError, DetokenizeRequest, TokenizeRequest

router = APIRouter()


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, bridge: Bridge) -> dict[str, Any]:
    """A prompt's token ids, as /v1/completions (a prompt) or /v1/chat/completions (messages) would send it."""
    check_model(bridge, body.model)
    if (body.prompt is None) == (body.messages is None):
        raise ApiError(400, "give 'prompt' or 'messages', one of the two", param="prompt")
    llm = bridge.llm
    ids = (await prompt_ids_of(llm, body.prompt) if body.prompt is not None
           else await chat_ids_of(llm.tokenizer, body.messages, body.add_generation_prompt))
    return {"count": len(ids), "max_model_len": llm.max_seq_len, "tokens": ids}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, bridge: Bridge) -> dict[str, Any]:
    check_model(bridge, body.model)
    tokenizer = bridge.llm.tokenizer
    outside = next((t for t in body.tokens if not 0 <= t < len(tokenizer)), None)
    if outside is not None:
        raise ApiError(400, f"token id {outside} is outside the tokenizer's vocabulary [0, {len(tokenizer)})",
                       param="tokens")
    return {"prompt": await asyncio.to_thread(tokenizer.decode, body.tokens)}
