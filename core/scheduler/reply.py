"""Reply: what the scheduler reports for one request after a step (a token, or the end)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(slots=True)
class Reply:
    """Treated as a value (changed only by copying: ``dataclasses.replace``, ``with_text``) but not declared
    frozen: a step builds one per request, and a frozen dataclass costs several times as much to build."""

    uid: int
    token: int | None
    finished: bool
    finish_reason: str | None = None  # 'stop' | 'length' | 'error' | 'abort' when finished
    error: str | None = None
    # for a request that asked (SamplingParams.logprobs): the token's logprob and the top alternatives
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] | None = None
    # for a request whose text the LLM follows (stop strings, or asked for): the text this reply adds, held
    # back while it could be the start of a stop string; and the stop string that ended it
    text: str | None = None
    stop_string: str | None = None

    def with_text(self, text: str) -> Reply:
        """This reply with the text it adds: built directly, as ``dataclasses.replace`` costs several times as
        much and a server does this once per token of every request."""
        return Reply(self.uid, self.token, self.finished, self.finish_reason, self.error, self.logprob,
                     self.top_logprobs, text, self.stop_string)

    @property
    def ended_on_token(self) -> bool:
        """The engine ended the request on this token (EOS, or one of its stop_token_ids): the token is not part of
        the output, as no stop string is."""
        return self.finish_reason == "stop" and self.stop_string is None and self.token is not None


ReplySink = Callable[[list[Reply]], None]  # where a scheduler's replies go (the LLM, or the engine process's outbox)
