"""llguidance's tables for the model's tokenizer: every token's bytes, which tokens are special, and the slices of
the vocabulary its mask computation starts from. Every matcher is built on them; the grammars' worker builds them
once (core/constrain/grammars.py).

llguidance builds them in Rust without letting the GIL go, so the engine loop's thread, which needs the GIL for
every step, waits out each of its calls. Two things keep those waits short:

* llguidance reads the model directory's tokenizer.json itself, instead of being handed the tokenizer loaded again
  through transformers and written back out as JSON (both long calls that hold the GIL too). transformers adds
  to tokenizer.json the special tokens that tokenizer_config.json names, so the file is used alone only where it
  already holds each of them as a special token (as checkpoints' files do); else the loaded tokenizer is used;
* the slices are built in a second call, after a pause in which the loop runs a step.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Iterator

# how long the worker leaves the GIL to the loop between its two long calls: a step or two on a CPU
LOOP_TURN_S = 0.03

# tokenizer_config.json's keys that name one special token each (a string, or an added token's fields)
NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def token_tables(tokenizer_dir: Path | None, load_tokenizer: Callable[[], Any], vocab_size: int,
                 eos_token_ids: list[int]) -> Any:
    """llguidance's LLTokenizer for ``tokenizer_dir``'s tokenizer.json where it holds all the tokenizer's tokens,
    else for the tokenizer ``load_tokenizer`` loads (a transformers tokenizer, or a ``random:`` model's bytes)."""
    from llguidance import LLTokenizer

    bare = _from_file(tokenizer_dir, vocab_size, eos_token_ids)
    if bare is None:
        bare = _from_loaded(load_tokenizer(), vocab_size, eos_token_ids)
    time.sleep(LOOP_TURN_S)
    return bare.with_slices(LLTokenizer.general_slices())


def _from_file(tokenizer_dir: Path | None, vocab_size: int, eos_token_ids: list[int]) -> Any | None:
    """The tables without slices from tokenizer.json alone; None where there is no such file (a ``random:``
    model's spec is no directory), where it does not hold a token tokenizer_config.json names, or where no EOS
    token is known (llguidance would guess one)."""
    from llguidance import LLTokenizer

    if not isinstance(tokenizer_dir, Path) or not eos_token_ids or not (tokenizer_dir / "tokenizer.json").is_file():
        return None
    text = (tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8")
    named = _named_tokens(tokenizer_dir)
    if named is None or not text.startswith("{"):  # llguidance reads any other string as a file's name or a hub's
        return None
    tables = LLTokenizer(text, n_vocab=vocab_size, eos_token=eos_token_ids, slices=[])
    return tables if all(_is_special(tables, content, token_id) for content, token_id in named) else None


def _named_tokens(tokenizer_dir: Path) -> list[tuple[str, int | None]] | None:
    """The tokens tokenizer_config.json names, each with its id where the file gives one ([] without the file,
    None where it cannot be read)."""
    path = tokenizer_dir / "tokenizer_config.json"
    if not path.is_file():
        return []
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(config, dict):
        return None
    ids = {content: int(token_id) for token_id, fields in (config.get("added_tokens_decoder") or {}).items()
           for content in _contents(fields)}
    for key in (*NAMED_SPECIAL, "additional_special_tokens", "extra_special_tokens"):
        ids.update((content, ids.get(content)) for content in _contents(config.get(key)))
    return list(ids.items())


def _contents(value: Any) -> Iterator[str]:
    """The token texts in one of tokenizer_config.json's values: a string, an added token's fields, or a list or
    mapping of either."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict) and isinstance(value.get("content"), str):
        yield value["content"]
    elif isinstance(value, (list, dict)):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _contents(item)


def _is_special(tables: Any, content: str, token_id: int | None) -> bool:
    """Whether ``content`` is a special token of the tables (the one numbered ``token_id``, where given; else the
    one it reads as, which llguidance finds only for a name in angle brackets)."""
    if token_id is None:
        ids = tables.tokenize_str(content, parse_special=True)
        token_id = ids[0] if len(ids) == 1 else -1
    return 0 <= token_id < tables.vocab_size and tables.is_special_token(token_id) and \
        tables.decode_bytes([token_id]) == content.encode()


def _from_loaded(tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> Any:
    """The tables without slices from a loaded tokenizer."""
    from llguidance import LLTokenizer, TokenizerWrapper

    eos = eos_token_ids or None
    if hasattr(tokenizer, "backend_tokenizer"):  # a transformers tokenizer over Hugging Face's tokenizers
        import llguidance.hf

        return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos, slices=[])
    return LLTokenizer(TokenizerWrapper(ByteTokens(vocab_size, eos_token_ids)), n_vocab=vocab_size, eos_token=eos,
                       slices=[])


class ByteTokens:
    """A ``random:`` model's byte tokenizer as llguidance reads one: ids below 256 are those bytes, the rest are
    special tokens that no grammar's text can contain."""

    def __init__(self, vocab_size: int, eos_token_ids: list[int]) -> None:
        self.tokens = [bytes([i]) if i < 256 else f"<|{i}|>".encode() for i in range(vocab_size)]
        self.special_token_ids = list(range(256, vocab_size))
        self.eos_token_id = eos_token_ids[0] if eos_token_ids else vocab_size - 1
        self.bos_token_id = None

    def __call__(self, text: bytes | str) -> list[int]:
        return list(text.encode("utf-8") if isinstance(text, str) else text)
