"""What a request's output must match, checked when it is made: no tokenizer and no model are needed to say
that a schema or a regular expression is wrong, so a server answers a 400 before the request is queued."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from core.errors import InvalidConstraintError

ConstraintKind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]
CONSTRAINT_KINDS: tuple[str, ...] = ("json_schema", "json_object", "regex", "choice", "grammar")
MAX_CHOICES = 1024

# JSON the way OpenAI's structured outputs write it: no free whitespace between tokens, so a sampled model cannot
# spend its tokens on blank lines inside an object
JSON_STYLE = {"whitespace_flexible": False}


@dataclass(frozen=True)
class Constraint:
    """``kind`` and its ``value``: ``json_schema``, the schema as JSON text; ``json_object``, nothing (any JSON
    object); ``regex``, a regular expression the whole output matches; ``choice``, the strings the output may be
    (exactly one of them); ``grammar``, a grammar in llguidance's Lark syntax. Frozen and hashable: the engine
    compiles each distinct constraint once. Build it with the class methods; the constructor checks it."""

    kind: ConstraintKind
    value: str | tuple[str, ...] = ""

    def __post_init__(self) -> None:
        if self.kind not in CONSTRAINT_KINDS:
            raise InvalidConstraintError(f"constraint kind must be one of {', '.join(CONSTRAINT_KINDS)}, "
                                         f"got {self.kind!r}")
        if self.kind == "choice":
            if not isinstance(self.value, tuple) or not self.value \
                    or not all(isinstance(c, str) and c for c in self.value):
                raise InvalidConstraintError(f"choice must be a non-empty list of non-empty strings, "
                                             f"got {self.value!r}")
            if len(self.value) > MAX_CHOICES:
                raise InvalidConstraintError(f"choice takes at most {MAX_CHOICES} strings, got {len(self.value)}")
        elif not isinstance(self.value, str) or (self.kind != "json_object" and not self.value):
            raise InvalidConstraintError(f"{self.kind} must be a non-empty string, got {self.value!r}")
        problem = _grammar_problem(self.grammar)
        if problem:
            raise InvalidConstraintError(f"{self.describe()} is not valid: {problem}")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str | bool) -> Constraint:
        """A JSON schema, as a dict or as JSON text."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise InvalidConstraintError(f"json_schema is not JSON: {exc}") from None
        if not isinstance(schema, (dict, bool)):
            raise InvalidConstraintError(f"json_schema must be a JSON object, got {type(schema).__name__}")
        return cls("json_schema", json.dumps(schema, separators=(",", ":")))

    @classmethod
    def json_object(cls) -> Constraint:
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls("regex", pattern)

    @classmethod
    def choice(cls, options: list[str] | tuple[str, ...]) -> Constraint:
        return cls("choice", tuple(options) if isinstance(options, (list, tuple)) else options)

    @classmethod
    def lark(cls, grammar: str) -> Constraint:
        return cls("grammar", grammar)

    @classmethod
    def unpack(cls, fields: dict[str, Any]) -> Constraint:
        """From ``dataclasses.asdict``'s form after a trip through msgpack (its tuple a list)."""
        value = fields["value"]
        return cls(fields["kind"], tuple(value) if isinstance(value, list) else value)

    def describe(self) -> str:
        """A few words for messages and the trace: which kind, and the start of its value."""
        if self.kind == "json_object":
            return "json_object"
        text = " | ".join(self.value) if isinstance(self.value, tuple) else self.value
        return f"{self.kind} {text[:60]!r}" if len(text) <= 60 else f"{self.kind} {text[:57] + '...'!r}"

    @property
    def grammar(self) -> str:
        """The constraint as llguidance's top-level grammar (what its matcher is built from)."""
        from llguidance import LLMatcher

        if self.kind in ("json_schema", "json_object"):
            schema = json.loads(self.value) if self.kind == "json_schema" else {"type": "object"}
            return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_STYLE)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.value)
        if self.kind == "choice":
            options = " | ".join(json.dumps(c, ensure_ascii=False) for c in self.value)  # Lark's string literals
            return LLMatcher.grammar_from_lark(f"start: {options}")
        return LLMatcher.grammar_from_lark(self.value)


def _grammar_problem(grammar: str) -> str:
    """llguidance's complaint about a grammar, on one line ('' when there is none)."""
    from llguidance import LLMatcher

    try:
        message = LLMatcher.validate_grammar(grammar)
    except Exception as exc:  # a schema llguidance cannot even read raises instead of answering
        message = str(exc)
    # drop llguidance's pointers under the text and its echo of the grammar's source lines ("  1 | start: ...")
    lines = [line.strip() for line in message.splitlines()]
    return " ".join(line for line in lines if line and line.strip("^ ") and not re.match(r"\d+ \|", line))


