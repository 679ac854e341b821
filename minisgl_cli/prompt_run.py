"""The prompts of one command, submitted to the engine one by one and answered as their replies arrive.

Built on ``LLM.submit``: each request's replies reach ``PromptRun`` as they are produced, so a progress bar
moves per token, a stream shows the text as it grows, and a run stopped with Ctrl-C still has every result
that had finished (the others are returned as 'interrupted', with the tokens they had so far).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.prompts import Prompt
from core.request import SamplingParams

if TYPE_CHECKING:
    from core.llm import LLM

Result = dict[str, Any]
INTERRUPTED = "interrupted"


@dataclass
class Collected:
    """One prompt's tokens so far and, once answered, how it finished."""

    prompt_tokens: int
    max_tokens: int
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


# (index of the prompt, its state after the reply, how many tokens the reply added)
Listener = Callable[[int, Collected, int], None]


class PromptRun:
    def __init__(self, llm: LLM, prompts: Sequence[Prompt], params: Sequence[SamplingParams]) -> None:
        self.llm = llm
        self.prompt_ids = [llm.tokenize(p) for p in prompts]  # every prompt checked before any is queued
        self.params = list(params)
        self.collected = [Collected(len(ids), sp.max_tokens) for ids, sp in zip(self.prompt_ids, self.params)]
        self.listeners: list[Listener] = []
        self.interrupted = False

    def run(self) -> list[Result]:
        """Submit every prompt and run the loop until all are answered; Ctrl-C ends the run early, keeping
        the results that finished (``interrupted`` then says so)."""
        eos = frozenset(self.llm.eos_token_ids)
        for i, (ids, sp) in enumerate(zip(self.prompt_ids, self.params)):
            self.llm.submit(ids, sp, on_reply=lambda reply, i=i: self._on_reply(i, reply, eos))
        try:
            self.llm.run_until_idle()
        except KeyboardInterrupt:
            self.interrupted = True
        return [self.result(got) for got in self.collected]

    def _on_reply(self, index: int, reply: Any, eos: frozenset[int]) -> None:
        got = self.collected[index]
        added = 0
        if reply.token is not None and not (reply.finish_reason == "stop" and reply.token in eos):
            got.token_ids.append(reply.token)
            added = 1
        if reply.finished:
            got.finish_reason, got.error = reply.finish_reason, reply.error
        for listen in self.listeners:
            listen(index, got, added)

    def text(self, got: Collected) -> str:
        return self.llm.tokenizer.decode(got.token_ids, skip_special_tokens=True)

    def result(self, got: Collected) -> Result:
        """The same dict as ``LLM.generate`` returns; an unanswered prompt of an interrupted run is
        'interrupted', with the tokens produced before Ctrl-C."""
        reason, error = got.finish_reason, got.error
        if reason is None:
            reason, error = (INTERRUPTED, None) if self.interrupted else ("error", "request was not completed")
        return {"text": self.text(got), "token_ids": list(got.token_ids), "finish_reason": reason, "error": error,
                "prompt_tokens": got.prompt_tokens}
