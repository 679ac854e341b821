"""Results on stdout, faithful wherever they go.

On a terminal Rich draws them, and a long line is left for the terminal to wrap (soft wrap), so no newline is
ever inserted into a completion. Piped or redirected, a completion is written as plain text, byte for byte
what the model produced: Rich would hard-wrap it at 80 columns and expand its tabs.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console

from minisgl_cli.prompt_run import Collected, PromptRun
from render.prompt_echo import echo_prompt
from render.results import Result, completion_body, completion_header, completion_plain, stream_footer, stream_header


def print_completion(out: Console, index: int, total: int, label: str, result: Result, separator: str = "") -> None:
    out.print(completion_header(index, total, result))
    if out.is_terminal:
        out.print(completion_body(label, result, separator), soft_wrap=True)
    else:
        out.file.write(completion_plain(label, result, separator) + "\n")
        out.file.flush()


class StreamPrinter:
    """The results in prompt order, each continuation written as its tokens arrive: the first prompt streams,
    a later one's text so far is written when its turn comes and it streams on from there.

    Text is written raw (faithful on a pipe too). A decoded text that ends in half a character waits for the
    next token; what has been written is never taken back."""

    def __init__(self, out: Console, run: PromptRun, labels: Sequence[str], separator: str = "") -> None:
        self.out, self.run, self.labels, self.separator = out, run, labels, separator
        self.current = 0
        self.shown = ""
        run.listeners.append(self.on_reply)

    def start(self) -> None:
        if self.labels:
            self._open(0)

    def on_reply(self, index: int, got: Collected, added: int) -> None:
        if index == self.current:
            self._catch_up()

    def finish(self, results: Sequence[Result]) -> None:
        """After the run (complete or interrupted): close the prompt being streamed, print the rest whole."""
        if self.current < len(self.labels):
            first = self.current
            self._close(results[first], open_next=False)
            for i in range(first + 1, len(self.labels)):
                print_completion(self.out, i, len(self.labels), self.labels[i], results[i], self.separator)

    def _open(self, index: int) -> None:
        self.shown = ""
        self.out.print(stream_header(index, len(self.labels), self.run.collected[index].prompt_tokens))
        self._write(echo_prompt(self.labels[index]) + self.separator)

    def _catch_up(self) -> None:
        while self.current < len(self.labels):
            got = self.run.collected[self.current]
            text = self.run.text(got)
            if not got.finished:
                text = text.rstrip("\ufffd")
            if text.startswith(self.shown) and len(text) > len(self.shown):
                self._write(text[len(self.shown):])
                self.shown = text
            if not got.finished:
                return
            self._close(self.run.result(got))

    def _close(self, result: Result, open_next: bool = True) -> None:
        self._write("\n" + (f"error: {result['error']}\n" if result["finish_reason"] == "error" else ""))
        self.out.print(stream_footer(result))
        self.current += 1
        if open_next and self.current < len(self.labels):
            self._open(self.current)

    def _write(self, text: str) -> None:
        self.out.file.write(text)
        self.out.file.flush()
