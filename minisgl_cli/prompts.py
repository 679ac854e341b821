"""Prompt files: what the command line reads, parsed into prompts plus the sampling values each one sets.

Two formats. ``.txt``: one prompt a line, blank lines skipped. ``.jsonl``: one JSON object a line with
``prompt`` (a string) or ``input_ids`` (a list of token ids), optionally any of the sampling fields below or a
``json_schema`` (an object) or ``regex`` (a string) its output must match, and
for the trace when the request arrives: ``arrival_step`` (before that step) or ``arrival_s`` (seconds after
the start).
Stdin and files with another suffix are JSONL when their first non-blank line is a JSON object, text otherwise.

Every mistake is a :class:`PromptFileError` whose message names the file and, for JSONL, the line, so that it
can be fixed without guessing. Per-prompt values are validated here (through ``SamplingParams``) for the same
reason: a bad ``max_tokens`` on line 7 should say "line 7", not fail later without a location.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from core.constraint import Constraint
from core.errors import InvalidParamsError, PromptFileError
from core.llm.arrivals import Arrival
from core.request import Prompt, SamplingParams

SAMPLING_KEYS = ("max_tokens", "temperature", "top_k", "top_p", "seed", "ignore_eos", "stop", "logprobs",
                 "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "min_p", "min_tokens",
                 "stop_token_ids")
ARRIVAL_KEYS = ("arrival_step", "arrival_s")
CONSTRAINT_KEYS = ("json_schema", "regex")  # the prompt's output must match one (structured output)
JSONL_KEYS = ("prompt", "input_ids") + SAMPLING_KEYS + CONSTRAINT_KEYS + ARRIVAL_KEYS
STDIN = "-"

@dataclass(frozen=True)
class PromptSpec:
    """One prompt as read from a file: the text or token ids, the sampling values it sets, where it came from."""

    prompt: Prompt
    overrides: dict[str, Any] = field(default_factory=dict)
    where: str = ""
    arrival: Arrival | None = None  # when it enters a running engine; None: at the start

    def params(self, explicit: Mapping[str, Any] | None = None) -> SamplingParams:
        """Sampling parameters for this prompt: built-in defaults, then the file's values, then ``explicit``
        (the options a user typed, which win so that ``--max-tokens 20`` applies to every prompt)."""
        return SamplingParams(**{**self.overrides, **(explicit or {})})


def read_prompts(source: str | Path, stdin: TextIO | None = None) -> list[PromptSpec]:
    """Read a prompts file (``-`` is stdin) into at least one prompt, or raise PromptFileError."""
    name = str(source)
    if name == STDIN:
        if stdin is None:
            raise PromptFileError("no standard input to read prompts from")
        text, label = stdin.read(), "standard input"
    else:
        text, label = _read_text(Path(name)), name
    prompts = parse_prompts(text, label, detect_format(name, text))
    if not prompts:
        raise PromptFileError(f"{label} has no prompts (blank lines are skipped); add at least one")
    return prompts


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PromptFileError(f"prompts file {path} not found") from None
    except IsADirectoryError:
        raise PromptFileError(f"{path} is a directory; pass a .txt or .jsonl prompts file") from None
    except PermissionError:
        raise PromptFileError(f"cannot read prompts file {path}: permission denied") from None
    except UnicodeDecodeError as exc:
        raise PromptFileError(f"prompts file {path} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise PromptFileError(f"cannot read prompts file {path}: {exc.strerror or exc}") from None


def detect_format(name: str, text: str) -> str:
    """'jsonl' or 'txt': by suffix, else by whether the first non-blank line is a JSON object."""
    suffix = Path(name).suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix == ".txt":
        return "txt"
    first = next((line.strip() for line in _lines(text) if line.strip()), "")
    if first.startswith("{"):
        try:
            return "jsonl" if isinstance(json.loads(first), dict) else "txt"
        except json.JSONDecodeError:
            return "txt"
    return "txt"


def parse_prompts(text: str, label: str, fmt: str) -> list[PromptSpec]:
    if fmt == "txt":
        return [PromptSpec(line, {}, f"{label} line {n}") for n, line in enumerate(_lines(text), 1) if line.strip()]
    if fmt == "jsonl":
        return [_parse_jsonl_line(line, f"{label} line {n}")
                for n, line in enumerate(_lines(text), 1) if line.strip()]
    raise ValueError(f"unknown prompts format {fmt!r}")


def _lines(text: str) -> list[str]:
    """Split on newlines only (str.splitlines would also split on form feeds and other separators that may
    belong to a prompt), dropping a trailing carriage return."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def _parse_jsonl_line(line: str, where: str) -> PromptSpec:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PromptFileError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise PromptFileError(f"{where}: expected a JSON object like {{\"prompt\": \"...\"}}, "
                              f"got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(JSONL_KEYS))
    if unknown:
        raise PromptFileError(f"{where}: unknown key {unknown[0]!r}; allowed keys are {', '.join(JSONL_KEYS)}")
    prompt = _prompt_of(obj, where)
    overrides = {key: obj[key] for key in SAMPLING_KEYS if key in obj}
    try:
        if len(set(CONSTRAINT_KEYS) & obj.keys()) > 1:
            raise InvalidParamsError("give json_schema or regex, not both")
        if "json_schema" in obj:
            overrides["constraint"] = Constraint.json_schema(obj["json_schema"])
        elif "regex" in obj:
            overrides["constraint"] = Constraint.regex(obj["regex"])
        SamplingParams(**overrides)
        arrival = Arrival(obj.get("arrival_step"), obj.get("arrival_s")) if set(ARRIVAL_KEYS) & obj.keys() else None
    except InvalidParamsError as exc:
        raise PromptFileError(f"{where}: {exc}") from None
    return PromptSpec(prompt, overrides, where, arrival)


def _prompt_of(obj: dict[str, Any], where: str) -> Prompt:
    if ("prompt" in obj) == ("input_ids" in obj):
        raise PromptFileError(f"{where}: give exactly one of \"prompt\" (text) or \"input_ids\" (token ids)")
    if "prompt" in obj:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise PromptFileError(f"{where}: \"prompt\" must be a non-empty string")
        return prompt
    ids = obj["input_ids"]
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise PromptFileError(f"{where}: \"input_ids\" must be a non-empty list of integers")
    return ids


def chat_input_ids(tokenizer: Any, text: str) -> list[int]:
    """The token ids of ``text`` as a user turn in the model's chat template, ready for the assistant's reply."""
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidParamsError("this model's tokenizer has no chat template; run without --chat")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True)
    if isinstance(ids, Mapping):  # transformers 5 returns a BatchEncoding, 4.x a plain list
        ids = ids["input_ids"]
    return [int(t) for t in ids]
