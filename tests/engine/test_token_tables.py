"""The tokenizer tables structured output builds from a model's tokenizer.json alone are llguidance's tables for
the tokenizer transformers loads: every token's bytes, which tokens are special, the EOS token, and so each
grammar's masks. Where tokenizer_config.json names a special token that tokenizer.json does not hold as one
(transformers makes it one), the tables come from the loaded tokenizer instead, and match it too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import llguidance.hf
import pytest
from llguidance import LLMatcher

from core.constrain.tables import token_tables
from core.constraint import Constraint
from core.models.tokenizer import load_tokenizer

CONSTRAINTS = (
    Constraint.json_schema({"type": "object", "required": ["name", "age"],
                            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}),
    Constraint.regex(r"[A-Z]{2}-[0-9]{2,3} ok"),
    Constraint.choice(["yes", "no", "not sure"]),
)


def masks(tables, constraint: Constraint, text: str) -> list[bytes]:
    """The grammar's bitmask at its start and after each of ``text``'s tokens."""
    matcher = LLMatcher(tables, constraint.grammar, log_level=0)
    found = [matcher.compute_bitmask()]
    for token in tables.tokenize_str(text):
        assert matcher.consume_token(token), text
        found.append(matcher.compute_bitmask())
    return found


@pytest.fixture(scope="module", params=["as converted", "naming a plain token special"])
def tokenizer_dir(request, smollm2_dir, tmp_path_factory) -> tuple[Path, bool]:
    """The embedded model's tokenizer files, and whether the tables can come from tokenizer.json alone."""
    if request.param == "as converted":
        return Path(smollm2_dir), True
    copy = tmp_path_factory.mktemp("tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(smollm2_dir) / name, copy / name)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    (copy / "tokenizer_config.json").write_text(json.dumps({**config, "additional_special_tokens": ["hello"]}))
    return copy, False


def test_tables_from_the_file_are_those_of_the_loaded_tokenizer(tokenizer_dir):
    directory, from_file = tokenizer_dir
    tokenizer = load_tokenizer(directory)
    vocab, eos = len(tokenizer), [tokenizer.eos_token_id]
    loaded = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=eos)
    loads: list[Path] = []
    built = token_tables(directory, lambda: loads.append(directory) or tokenizer, vocab, eos)

    assert loads == ([] if from_file else [directory])
    assert (built.vocab_size, built.eos_token) == (loaded.vocab_size, loaded.eos_token)
    assert built.is_special_token(built.tokenize_str("hello", parse_special=True)[0]) is not from_file
    for token in range(vocab):
        assert built.decode_bytes([token]) == loaded.decode_bytes([token]), token
        assert built.is_special_token(token) == loaded.is_special_token(token), token
    for constraint, text in zip(CONSTRAINTS, ('{"name":"Ann","age":7}', "AB-123 ok", "not sure")):
        assert masks(built, constraint, text) == masks(loaded, constraint, text)
