"""The prompts of one command, submitted to the engine one by one and answered as their replies arrive.

Built on ``LLM.submit``: each request's replies reach ``PromptRun`` as they are produced, so a progress bar
moves per token, a stream shows the text as it grows, and a run stopped with Ctrl-C still has every result
that had finished (the others are returned as 'interrupted', with the tokens they had so far).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from core.llm.collect import UNANSWERED, Collected
from minisgl_cli.prompts import Prompt
from core.request import Result, SamplingParams

if TYPE_CHECKING:
    from core.llm import LLM

INTERRUPTED = "interrupted"


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
        for i, (ids, sp) in enumerate(zip(self.prompt_ids, self.params)):
            self.llm.submit(ids, sp, on_reply=lambda reply, i=i: self._on_reply(i, reply))
        try:
            self.llm.run_until_idle()
        except KeyboardInterrupt:
            self.interrupted = True
        return [self.result(got) for got in self.collected]

    def _on_reply(self, index: int, reply: Any) -> None:
        got = self.collected[index]
        added = got.on_reply(reply)
        for listen in self.listeners:
            listen(index, got, added)

    def text(self, got: Collected) -> str:
        return got.decoded(self.llm.tokenizer)

    def result(self, got: Collected) -> Result:
        """The same dict as ``LLM.generate`` returns; an unanswered prompt of an interrupted run is
        'interrupted', with the tokens produced before Ctrl-C."""
        return got.result(self.llm.tokenizer, (INTERRUPTED, None) if self.interrupted else UNANSWERED)
