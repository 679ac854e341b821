"""The trace file: a run's settings, its step events and its results as versioned JSON lines.

One JSON object a line, each with a ``type``:

    {"type": "header", "format": "minisgl-trace", "version": 1, "model": ..., "options": {...}, "prompts": [...]}
    {"type": "step", "step": 0, "phase": "prefill", ...}      one per scheduled batch, flushed as it happens
                                                               (with the radix tree: "radix_text", each node's
                                                               first tokens as text, since a replay has no
                                                               tokenizer)
    {"type": "results", "results": [...]}                      only when the run finished

Every line is written whole and flushed, so a run stopped part way (Ctrl-C) leaves a valid file without the
results line: it replays as an interrupted run. The reader is strict, because a replay that silently shows
something other than what ran would teach the wrong thing: a cut line, an unknown or ill-typed field, a step
out of order, a uid no prompt has or a newer format is refused with a ``TraceFormatError`` naming the line.
docs/trace-format.md describes the format for people who read these files with other tools.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from core.events import ReqStep, StepEvent
from core.words import plural

FORMAT = "minisgl-trace"
VERSION = 1
# fields that earlier builds wrote in this version and this one no longer has, with the value that said nothing:
# read and dropped where they hold it, refused where they do not (a request row's `decoding` was true only for a
# decoding request riding in a prefill step, which this version does not run or show)
RETIRED_FIELDS: dict[type, dict[str, Any]] = {ReqStep: {"decoding": False}}


class TraceFormatError(ValueError):
    """A trace file that cannot be replayed faithfully; the message names the file and the line."""


@dataclass(frozen=True)
class TraceHeader:
    """What the run was: the model, the options it ran with, and each prompt's label in the file's order
    (requests get uids in the order they arrive; the results line says which uid each prompt got)."""

    model: str
    options: dict[str, Any]
    prompts: tuple[str, ...]
    version: int = VERSION

    @property
    def open_ended(self) -> bool:
        """A server's trace: requests come from clients, so no prompt is known when the header is written."""
        return self.options.get("source") == "serve"

    @property
    def show_cached(self) -> bool:
        """Whether a prefix cache could have reused tokens, so the views show cached lengths."""
        return self.options.get("cache") != "naive"

    def to_dict(self) -> dict[str, Any]:
        return {"type": "header", "format": FORMAT, "version": self.version, "model": self.model,
                "options": self.options, "prompts": list(self.prompts)}


@dataclass(frozen=True)
class Trace:
    """A whole trace, as written or as read back. ``results`` is None when the run did not finish."""

    header: TraceHeader
    events: list[StepEvent] = field(default_factory=list)
    results: list[dict[str, Any]] | None = None
    token_text: dict[tuple[int, ...], str] = field(default_factory=dict)  # radix nodes' first tokens, as text

    @property
    def finished(self) -> bool:
        return self.results is not None

    @property
    def labels_by_uid(self) -> tuple[str, ...]:
        """Each uid's prompt label: the results say which uid each prompt got; a run without results is taken
        to have submitted them in the file's order."""
        if self.results is None:
            return self.header.prompts
        labels = list(self.header.prompts)
        for label, result in zip(self.header.prompts, self.results):
            labels[result["uid"]] = label
        return tuple(labels)

    def decode(self, token_ids: list[int]) -> str:
        """The text the run's tokenizer gave these tokens, where the file kept it; else the ids."""
        text = self.token_text.get(tuple(token_ids))
        return text if text is not None else " ".join(map(str, token_ids))

    def with_token_text(self, decode: Callable[[list[int]], str]) -> "Trace":
        """This trace with the text of every radix node's first tokens, from the run's tokenizer."""
        return dataclasses.replace(self, token_text=radix_token_text(self.events, decode))


def radix_token_text(events: list[StepEvent], decode: Callable[[list[int]], str]) -> dict[tuple[int, ...], str]:
    return {node.first_tokens: decode(list(node.first_tokens)) for e in events for node in e.radix or ()}


def _step_record(event: StepEvent, decode: Callable[[list[int]], str] | None) -> dict[str, Any]:
    record = {"type": "step", **event.to_dict()}
    if event.radix is not None and decode is not None:
        record["radix_text"] = [decode(list(node.first_tokens)) for node in event.radix]
    return record


# ---- writing ---------------------------------------------------------------------------------------------

class TraceWriter:
    """Writes a trace as the run goes: the header at once, a line per step, the results at the end.

    Opened before the model loads, so an unwritable path fails at once (OSError from ``open``)."""

    def __init__(self, path: Path | str, header: TraceHeader) -> None:
        self.path = Path(path)
        self.steps = 0
        self._file: TextIO = open(self.path, "w", encoding="utf-8")
        self._line(header.to_dict())

    def write_step(self, event: StepEvent, decode: Callable[[list[int]], str] | None = None) -> None:
        """``decode``: the tokenizer, so the file keeps the radix tree's token spans as text."""
        self._line(_step_record(event, decode))
        self.steps += 1

    def write_results(self, results: list[dict[str, Any]]) -> None:
        self._line({"type": "results", "results": [_result_record(r) for r in results]})

    def close(self) -> None:
        self._file.close()

    def _line(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")  # one write a line: never half a record
        self._file.flush()


def trace_lines(trace: Trace) -> str:
    """The whole file's text for a trace held in memory (what ``TraceWriter`` writes line by line)."""
    decode = trace.decode if trace.token_text else None
    records = [trace.header.to_dict()] + [_step_record(e, decode) for e in trace.events]
    if trace.results is not None:
        records.append({"type": "results", "results": [_result_record(r) for r in trace.results]})
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


_RESULT_FIELDS = {"uid": int, "text": str, "token_ids": list, "finish_reason": str, "error": (str, type(None)),
                  "prompt_tokens": int}


def _result_record(result: dict[str, Any]) -> dict[str, Any]:
    return {key: result.get(key) for key in _RESULT_FIELDS}


# ---- reading ---------------------------------------------------------------------------------------------

def read_trace(path: Path | str) -> Trace:
    """Read and check a trace file; raises ``TraceFormatError`` (one line, with the line number) if it is not
    a complete, unedited trace of a format this version knows, or OSError if it cannot be read."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    return parse_trace(text, name=str(path))


def parse_trace(text: str, name: str = "trace") -> Trace:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:  # every line the writer writes ends with a newline: a last line without one was cut
        raise TraceFormatError(f"{name}, line {len(lines)}: the line is cut short (the file was truncated)")
    if not lines:
        raise TraceFormatError(f"{name}, line 1: empty file, not a minisgl trace")
    header = _parse_header(_record(lines[0], 1, name), name)
    events: list[StepEvent] = []
    history = _History()
    results = None
    token_text: dict[tuple[int, ...], str] = {}
    for number, line in enumerate(lines[1:], start=2):
        record = _record(line, number, name)
        where = f"{name}, line {number}"
        if results is not None:
            raise TraceFormatError(f"{where}: a line after the results, which end a trace")
        kind = record.pop("type", None)
        if kind == "step":
            radix_text = record.pop("radix_text", None)
            event = _decode(StepEvent, record, where)
            if radix_text is not None:
                if (event.radix is None or not isinstance(radix_text, list) or len(radix_text) != len(event.radix)
                        or not all(isinstance(t, str) for t in radix_text)):
                    raise TraceFormatError(f"{where}: 'radix_text' must hold one string per radix node")
                token_text.update(zip((n.first_tokens for n in event.radix), radix_text))
            _check_step(event, len(events), None if header.open_ended else len(header.prompts), where)
            history.check(event, where)
            events.append(event)
        elif kind == "results":
            results = _parse_results(record, len(header.prompts), where)
        else:
            raise TraceFormatError(f"{where}: unknown line type {kind!r} (expected 'step' or 'results')")
    if header.open_ended:  # label each client's request by its uid, so every view reads it like a file's prompts
        seen = [r.uid for e in events for r in e.reqs] + [u for e in events for u in (*e.arrived, *e.finished)]
        labels = tuple(f"request uid{uid}" for uid in range(max(seen, default=-1) + 1))
        header = dataclasses.replace(header, prompts=labels)
    return Trace(header, events, results, token_text)


def _record(line: str, number: int, name: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{name}, line {number}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(record, dict):
        raise TraceFormatError(f"{name}, line {number}: expected a JSON object")
    return record


def _parse_header(record: dict[str, Any], name: str) -> TraceHeader:
    where = f"{name}, line 1"
    if record.get("type") != "header" or record.get("format") != FORMAT:
        raise TraceFormatError(f"{where}: not a minisgl trace (no header line; was it written by --trace-out?)")
    version = record.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise TraceFormatError(f"{where}: bad format version {version!r}")
    if version > VERSION:
        raise TraceFormatError(f"{where}: trace format version {version} is newer than this minisgl reads "
                               f"(version {VERSION}); upgrade minisgl to replay it")
    extra = set(record) - {"type", "format", "version", "model", "options", "prompts"}
    if extra:
        raise TraceFormatError(f"{where}: unknown header field {sorted(extra)[0]!r}")
    model, options, prompts = record.get("model"), record.get("options"), record.get("prompts")
    if not isinstance(model, str):
        raise TraceFormatError(f"{where}: 'model' must be a string")
    if not isinstance(options, dict):
        raise TraceFormatError(f"{where}: 'options' must be an object")
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise TraceFormatError(f"{where}: 'prompts' must be a list of strings")
    return TraceHeader(model, options, tuple(prompts), version)


def _check_step(event: StepEvent, expected_step: int, num_prompts: int | None, where: str) -> None:
    """What the scheduler guarantees of every event; a file that breaks it was edited or damaged."""
    problems = []
    if event.step != expected_step:
        problems.append(f"step {event.step} where step {expected_step} was expected")
    if event.batch_size != len(event.reqs):
        problems.append(f"batch_size {event.batch_size} but {plural(len(event.reqs), 'request')}")
    if event.num_tokens != sum(r.extend_len for r in event.reqs):
        problems.append(f"num_tokens {event.num_tokens} is not the sum of the extend lengths")
    uids = [r.uid for r in event.reqs] + list(event.finished) + list(event.arrived) + [w.uid for w in event.waits]
    uids += list(event.preempted)
    strangers = sorted({u for u in uids if not 0 <= u < (num_prompts if num_prompts is not None else u + 1)})
    if strangers:
        problems.append(f"uid {strangers[0]} but the header has {plural(num_prompts, 'prompt')}")
    if not 0 <= event.kv_pages_cached <= event.kv_pages_used <= event.kv_pages_total:
        problems.append("KV pages out of range (cached <= used <= total)")
    if problems:
        raise TraceFormatError(f"{where}: {problems[0]}")


@dataclass
class _History:
    """What earlier steps said about each request, for the checks that span steps."""

    prefilled: set[int] = field(default_factory=set)
    finished: set[int] = field(default_factory=set)

    def check(self, event: StepEvent, where: str) -> None:
        for req in event.reqs:
            if req.uid in self.finished:
                raise TraceFormatError(f"{where}: uid {req.uid} runs after it finished")
            if event.phase == "decode" and req.uid not in self.prefilled:
                raise TraceFormatError(f"{where}: uid {req.uid} decodes before any prefill")
            if event.phase == "decode" and req.extend_len != 1:
                raise TraceFormatError(f"{where}: uid {req.uid} decodes {plural(req.extend_len, 'token')} "
                                       f"(one per step)")
        self.prefilled.update(r.uid for r in event.reqs)
        self.finished.update(event.finished)


def _parse_results(record: dict[str, Any], num_prompts: int, where: str) -> list[dict[str, Any]]:
    results = record.pop("results", None)
    if record:
        raise TraceFormatError(f"{where}: unknown field {sorted(record)[0]!r}")
    if not isinstance(results, list) or len(results) != num_prompts:
        raise TraceFormatError(f"{where}: 'results' must list one result per prompt ({num_prompts})")
    for i, result in enumerate(results):
        if not isinstance(result, dict) or set(result) != set(_RESULT_FIELDS):
            raise TraceFormatError(f"{where}: result {i} must have exactly the fields {', '.join(_RESULT_FIELDS)}")
        for key, kind in _RESULT_FIELDS.items():
            if not isinstance(result[key], kind) or isinstance(result[key], bool):
                raise TraceFormatError(f"{where}: result {i}: bad {key!r}")
    if sorted(r["uid"] for r in results) != list(range(num_prompts)):  # uids follow arrival, not file order
        raise TraceFormatError(f"{where}: the results' uids are not one per prompt (0 to {num_prompts - 1})")
    return results


def _decode(cls: type, data: Any, where: str, path: str = "") -> Any:
    """A dataclass from its ``asdict`` form, checked against the field types: the schema is core/events.py
    itself, so a field added there is read here too (a missing field takes its default, an unknown one is
    refused)."""
    if not isinstance(data, dict):
        raise TraceFormatError(f"{where}: {path or cls.__name__} must be an object")
    for name, quiet in RETIRED_FIELDS.get(cls, {}).items():
        if name in data:
            if data[name] != quiet:
                raise TraceFormatError(f"{where}: {path + name} is {data[name]!r}: a step this version cannot show")
            data = {k: v for k, v in data.items() if k != name}
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise TraceFormatError(f"{where}: unknown field {path + sorted(unknown)[0]!r}")
    values = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise TraceFormatError(f"{where}: missing field {path + name!r}")
            continue
        values[name] = _value(hints[name], data[name], where, path + name)
    return cls(**values)


def _value(hint: Any, value: Any, where: str, path: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _value(inner, value, where, path)
    if origin is typing.Literal:
        if value not in args:
            raise TraceFormatError(f"{where}: {path} is {value!r}, not one of {', '.join(map(repr, args))}")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise TraceFormatError(f"{where}: {path} must be a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], v, where, f"{path}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise TraceFormatError(f"{where}: {path} must have {len(args)} items")
        return tuple(_value(a, v, where, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if dataclasses.is_dataclass(hint):
        return _decode(hint, value, where, path + ".")
    if hint is bool:
        if not isinstance(value, bool):
            raise TraceFormatError(f"{where}: {path} must be true or false")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TraceFormatError(f"{where}: {path} must be a number")
        return float(value)
    if hint in (int, str):
        if isinstance(value, bool) or not isinstance(value, hint):
            raise TraceFormatError(f"{where}: {path} must be {'an integer' if hint is int else 'a string'}")
        if hint is int and value < 0 and not path.endswith("parent_id"):
            raise TraceFormatError(f"{where}: {path} must not be negative")
        return value
    raise TypeError(f"no trace decoding for {hint!r} ({path})")  # a new kind of field in core/events.py
