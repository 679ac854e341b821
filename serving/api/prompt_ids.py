"""A request's prompt as token ids: a text tokenized, messages through the model's chat template. Both run on a
worker thread: the tokenizer lets go of the interpreter lock, so the loop goes on streaming to everyone else
however long the text (token ids are only checked, on the loop)."""

from __future__ import annotations

import asyncio
from typing import Any

from core.errors import InvalidParamsError
from serving.api.protocol import ApiError, Message, template_messages


async def prompt_ids_of(llm: Any, prompt: str | list[int]) -> list[int]:
    return await asyncio.to_thread(token_ids, llm, prompt) if isinstance(prompt, str) else token_ids(llm, prompt)


def token_ids(llm: Any, prompt: str | list[int]) -> list[int]:
    try:
        return llm.tokenize(prompt)
    except InvalidParamsError as exc:
        raise ApiError(400, str(exc), param="prompt") from None


async def chat_ids_of(tokenizer: Any, messages: list[Message], add_generation_prompt: bool = True,
                      tools: list[dict[str, Any]] | None = None) -> list[int]:
    return await asyncio.to_thread(chat_ids, tokenizer, messages, add_generation_prompt, tools)


def chat_ids(tokenizer: Any, messages: list[Message], add_generation_prompt: bool,
             tools: list[dict[str, Any]] | None = None) -> list[int]:
    """The ids of ``messages`` through the chat template (which also reads ``tools``, where it knows them)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ApiError(400, "this model's tokenizer has no chat template; use /v1/completions", param="messages")
    rendered = template_messages(messages)  # a part that cannot be read is refused here, naming its message
    try:
        ids = tokenizer.apply_chat_template(rendered, add_generation_prompt=add_generation_prompt, tokenize=True,
                                            tools=tools)
    except Exception as exc:  # a template that refuses these roles, say
        raise ApiError(400, f"the chat template refused these messages: {exc}", param="messages") from None
    if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]
