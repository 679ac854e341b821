"""A request's text as its tokens arrive: incremental detokenization and stop strings.

Decoding every token alone breaks multi-byte characters and words that a tokenizer spells across tokens;
decoding the whole output at every token costs O(n^2). So each step decodes a short window: the tokens since
the last clean point, with the text they had then as the reference (``prefix``), and emits the difference.
The text held back while it ends in a partial character ('\\ufffd') comes out with the next token or at the
finish, so the pieces always join to the text of the whole output.

Stop strings are searched in that text. Text that could still be the beginning of a stop string is held back
too, so a streaming client never sees a part of a stop string that the final text does not contain.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

PROMPT_CONTEXT = 5  # prompt tokens decoded with the first output token: a tokenizer's leading-space rules
INCOMPLETE = "\ufffd"


@dataclass
class TextPiece:
    """What one token adds to the visible text; ``stop`` is the stop string that ended the request, if any."""

    text: str
    stop: str | None = None


def window_decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """``tokenizer.decode(ids, skip_special_tokens=True)``. For a transformers fast tokenizer that cleans up no
    spaces that is its Rust tokenizer's decode and nothing more, so that one is called directly: the Python
    around it costs more than decoding a window of a few tokens, which happens twice per token."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if getattr(tokenizer, "is_fast", False) and backend is not None \
            and getattr(tokenizer, "clean_up_tokenization_spaces", True) is False:
        return partial(backend.decode, skip_special_tokens=True)
    return partial(tokenizer.decode, skip_special_tokens=True)


class TextStream:
    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int], stop: Sequence[str] = ()) -> None:
        self._decode = window_decoder(tokenizer)
        self.stop = tuple(stop)
        self._ids = list(prompt_ids[-PROMPT_CONTEXT:])
        self._prefix_at = 0  # the window starts here
        self._read_at = len(self._ids)  # tokens up to here are in ``text``
        self.text = ""  # the output's text decoded so far
        self._released = 0  # characters of ``text`` already handed out
        self.stopped: str | None = None

    def add(self, token: int) -> TextPiece:
        """The text that ``token`` makes visible (maybe none yet)."""
        self._ids.append(token)
        self._decode_window(final=False)
        return self._release()

    def finish(self) -> TextPiece:
        """The request ended (EOS, length, abort): everything still held back."""
        self._decode_window(final=True)
        piece = self._release()
        if self.stopped is None:
            piece.text += self.text[self._released:]
            self._released = len(self.text)
        return piece

    def _decode_window(self, final: bool) -> None:
        if self.stopped is not None:
            return
        prefix = self._decode(self._ids[self._prefix_at:self._read_at])
        full = self._decode(self._ids[self._prefix_at:])
        if len(full) <= len(prefix) or (full.endswith(INCOMPLETE) and not final):
            return  # nothing new, or a character still being spelled
        self.text += full[len(prefix):]
        self._prefix_at, self._read_at = self._read_at, len(self._ids)

    def _release(self) -> TextPiece:
        """Hand out new text up to a stop string (and end there), or up to what could start one."""
        if self.stopped is not None:
            return TextPiece("")
        found = self._find_stop()
        if found is not None:
            at, stop = found
            self.stopped = stop
            piece = TextPiece(self.text[self._released:at], stop)
            self.text = self.text[:at]
            self._released = at
            return piece
        end = len(self.text) - self._held_back()
        piece = TextPiece(self.text[self._released:end])
        self._released = max(self._released, end)
        return piece

    def _find_stop(self) -> tuple[int, str] | None:
        if not self.stop:
            return None
        longest = max(len(s) for s in self.stop)
        start = max(0, self._released - longest + 1)
        hits = [(at, s) for s in self.stop if (at := self.text.find(s, start)) >= 0]
        return min(hits) if hits else None

    def _held_back(self) -> int:
        """The length of the longest end of the text that begins some stop string."""
        tail = self.text[self._released:]
        for size in range(min(len(tail), max((len(s) for s in self.stop), default=1) - 1), 0, -1):
            if any(s.startswith(tail[-size:]) for s in self.stop):
                return size
        return 0
