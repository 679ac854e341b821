"""Log probabilities in the two shapes OpenAI's endpoints give them: completions key the alternatives by text,
chat lists them with each token's bytes."""

from __future__ import annotations

from typing import Any

from core.scheduler.reply import Reply


def token_text(tokenizer: Any, token: int) -> str:
    return tokenizer.decode([token], skip_special_tokens=False)


def completion_logprobs(tokenizer: Any, entries: list[Reply], offset: int) -> dict[str, Any] | None:
    """/v1/completions' ``logprobs``; ``offset``: where the first entry's text starts in the choice's text."""
    if not entries:
        return None
    tokens = [token_text(tokenizer, r.token) for r in entries]
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [r.logprob for r in entries],
            "top_logprobs": [top_dict(tokenizer, r) for r in entries], "text_offset": offsets}


def top_dict(tokenizer: Any, reply: Reply) -> dict[str, float]:
    """Completions key the alternatives by text; tokens that decode alike keep the likeliest one's value."""
    out: dict[str, float] = {}
    for token, logprob in reply.top_logprobs or ():
        out.setdefault(token_text(tokenizer, token), logprob)
    return out


def chat_logprobs(tokenizer: Any, entries: list[Reply]) -> dict[str, Any] | None:
    """/v1/chat/completions' ``logprobs``: each token with its text, bytes and alternatives."""
    def item(token: int, logprob: float) -> dict[str, Any]:
        text = token_text(tokenizer, token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    if not entries:
        return None
    return {"content": [{**item(r.token, r.logprob),
                         "top_logprobs": [item(t, lp) for t, lp in r.top_logprobs or ()]} for r in entries]}
