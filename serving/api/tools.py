"""Tools on chat: ``tools`` (functions with JSON-schema parameters) and ``tool_choice``.

``required`` and a named function constrain the reply to calls whose arguments match the functions' schemas (the
engine's structured output): a named function's reply is its arguments object; ``required``'s, a JSON array of
``{"name", "arguments"}`` calls. ``auto`` lets the model choose, and reads its calls in the form chat templates
that know tools teach it, Hermes': ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; a template
that knows no tools cannot teach it, so ``auto`` is refused there. ``none`` calls nothing. The calls come back
as ``message.tool_calls`` (arguments as a JSON string) with ``finish_reason`` ``tool_calls``."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict

from core.constraint import Constraint
from serving.api.structured import FieldError

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
HERMES_CALL = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*" + re.escape(CALL_CLOSE), re.DOTALL)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")  # what a template may read beside the fields used here


class FunctionDef(_Open):
    name: str
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class Tool(_Open):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Union[Literal["none", "auto", "required"], NamedToolChoice]


@dataclass(frozen=True)
class ToolMode:
    """How a request's reply is read: ``none`` (no tools), ``auto``, ``required``, or ``named`` (``name``)."""

    kind: Literal["none", "auto", "required", "named"]
    name: str | None = None

    def constraint(self, tools: list[Tool], parallel: bool) -> Constraint | None:
        """What the reply must match: for ``required`` and ``named``, the calls; else nothing."""
        if self.kind == "named":
            return Constraint.json_schema(_parameters(next(t for t in tools if t.function.name == self.name)))
        if self.kind != "required":
            return None
        calls = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                  "properties": {"name": {"const": t.function.name}, "arguments": _parameters(t)}} for t in tools]
        array = {"type": "array", "items": {"anyOf": calls}, "minItems": 1, **({} if parallel else {"maxItems": 1})}
        return Constraint.json_schema(array)

    def calls(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """The reply's text less its calls, and the calls in OpenAI's shape; no calls if they cannot be read (a
        reply cut by max_tokens)."""
        try:
            if self.kind == "named":
                return "", [_call(self.name, json.loads(text))]
            if self.kind == "required":
                return "", [_call(c["name"], c["arguments"]) for c in json.loads(text)]
            if self.kind == "auto":
                found = [json.loads(body) for body in HERMES_CALL.findall(text)]
                calls = [_call(c["name"], c.get("arguments", c.get("parameters", {}))) for c in found]
                return (HERMES_CALL.sub("", text).strip() if calls else text), calls
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        return text, []


    def message(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        """The reply as a chat message, and its finish reason: ``tool_calls`` where it made calls."""
        content, calls = self.calls(text) if self.kind != "none" else (text, [])
        if not calls:
            return {"role": "assistant", "content": text}, finish_reason
        return {"role": "assistant", "content": content or None, "tool_calls": calls}, "tool_calls"

    def holds_from(self, text: str) -> int | None:
        """Where in a streamed reply's text a call may begin (held back from there until the reply ends), or None:
        all of it under ``required`` or a named function; under ``auto`` at the Hermes tag, or at a tail that
        could still become it."""
        if self.kind in ("required", "named"):
            return 0
        if self.kind != "auto":
            return None
        at = text.find(CALL_OPEN)
        if at >= 0:
            return at
        tail = next((n for n in range(min(len(text), len(CALL_OPEN) - 1), 0, -1)
                     if CALL_OPEN.startswith(text[-n:])), 0)
        return len(text) - tail if tail else None


def tool_mode(tools: list[Tool] | None, choice: ToolChoice | None, template: str | None) -> ToolMode:
    """The request's tool mode, or a FieldError naming the field that cannot be honoured."""
    if not tools:
        if choice not in (None, "none"):
            raise FieldError("'tool_choice' needs 'tools'", param="tool_choice")
        return ToolMode("none")
    names = [t.function.name for t in tools]
    choice = choice or "auto"  # OpenAI's default when tools are given
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise FieldError(f"'tool_choice' names '{choice.function.name}', which is not among the tools "
                             f"({', '.join(names)})", param="tool_choice")
        return ToolMode("named", choice.function.name)
    if choice == "auto" and "tools" not in (template or ""):
        raise FieldError("tool_choice 'auto' (the default with tools) needs a chat template that knows tools, and "
                         "this model's does not: ask for 'required' or a named function, whose calls the server "
                         "constrains, or 'none'", param="tool_choice")
    return ToolMode(choice)


def _parameters(tool: Tool) -> dict[str, Any]:
    return tool.function.parameters or {"type": "object", "properties": {}}


def _call(name: str, arguments: Any) -> dict[str, Any]:
    if not isinstance(name, str) or not isinstance(arguments, dict):
        raise TypeError("a call is a name and an arguments object")
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}
