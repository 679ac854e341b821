"""One request's result, gathered from its replies: what generate() returns and what the command line shows
while a run is still going (a progress bar, a stream, the results kept on Ctrl-C)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.request import Result, TokenLogprob

if TYPE_CHECKING:
    from core.scheduler.reply import Reply

UNANSWERED = ("error", "request was not completed")


@dataclass
class Collected:
    prompt_tokens: int
    max_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)
    text: list[str] | None = None  # the pieces, when the LLM followed the text (stop strings)
    stop_string: str | None = None
    logprobs: list[TokenLogprob] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def on_reply(self, reply: Reply) -> int:
        """Take one reply in; returns how many tokens it added (0 or 1). An EOS or stop token id that stopped the
        request is not part of the output."""
        added = 0
        if reply.token is not None and not reply.ended_on_token:
            self.token_ids.append(reply.token)
            added = 1
            if reply.logprob is not None:
                self.logprobs = self.logprobs or []
                self.logprobs.append({"token_id": reply.token, "logprob": reply.logprob,
                                      "top_logprobs": [list(pair) for pair in reply.top_logprobs or ()]})
        if reply.text is not None:
            self.text = (self.text or []) + [reply.text]
        if reply.finished:
            self.finish_reason, self.error = reply.finish_reason, reply.error
            self.stop_string = reply.stop_string
            self.done.set()
        return added

    def decoded(self, tokenizer: Any) -> str:
        return "".join(self.text) if self.text is not None else tokenizer.decode(self.token_ids,
                                                                                skip_special_tokens=True)

    def result(self, tokenizer: Any, unanswered: tuple[str, str | None] = UNANSWERED) -> Result:
        """The result dict; a request the loop never answered gets ``unanswered`` as its finish and error,
        so it never passes silently."""
        reason, error = (self.finish_reason, self.error) if self.finished else unanswered
        result: Result = {"text": self.decoded(tokenizer), "token_ids": list(self.token_ids), "finish_reason": reason,
                          "error": error, "prompt_tokens": self.prompt_tokens}
        if self.stop_string is not None:
            result["stop"] = self.stop_string
        if self.logprobs is not None:
            result["logprobs"] = self.logprobs
        return result
