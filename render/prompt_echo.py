"""A prompt as it is echoed above its result: whole when short, cut to one line when long.

A refused 10,000-word prompt would otherwise fill hundreds of lines before its one-line error. The head and
the tail are kept, so a continuation still reads on from where the prompt ended; the full prompt is in
``--json`` output and in the file it came from.
"""

from __future__ import annotations

MAX_CHARS = 300  # a prompt longer than this, or of more than MAX_LINES lines, is cut
MAX_LINES = 2
HEAD_CHARS = 120
TAIL_CHARS = 60


def echo_prompt(prompt: str) -> str:
    if len(prompt) <= MAX_CHARS and prompt.count("\n") < MAX_LINES:
        return prompt
    head = prompt[:HEAD_CHARS].split("\n")[0]
    tail = prompt[-TAIL_CHARS:].split("\n")[-1]
    hidden = len(prompt) - len(head) - len(tail)
    return f"{head} [… {hidden:,} characters not shown …] {tail}"
