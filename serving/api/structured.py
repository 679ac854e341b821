"""Structured output as clients ask for it: OpenAI's ``response_format`` (a JSON schema, or any JSON object) and
vLLM's ``structured_outputs`` (one of ``json``, ``regex``, ``choice``, ``grammar``), each made into the engine's
Constraint (core/constraint.py) when the body is read: a schema or a regular expression that is wrong is a
400 naming it, before anything is queued."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from core.constraint import Constraint
from core.errors import InvalidConstraintError


class FieldError(ValueError):
    """A structured-output field that cannot be used: the body's ``param`` and what is wrong with it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message, self.param = message, param


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class JsonSchemaFormat(_Strict):
    """``response_format.json_schema``: the schema and its label (``strict`` is how this server works anyway: the
    output always matches the schema)."""

    name: str
    description: Optional[str] = None
    schema_: Union[dict[str, Any], bool, None] = Field(None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class StructuredOutputs(_Strict):
    """vLLM's ``structured_outputs``: exactly one of these. ``grammar`` is in Lark's syntax, as llguidance reads it."""

    json_: Union[dict[str, Any], str, bool, None] = Field(None, alias="json")
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None


def constraint_of(response_format: ResponseFormat | None,
                  structured_outputs: StructuredOutputs | None) -> Constraint | None:
    """The body's constraint, or None; a FieldError naming the field for one that cannot be used."""
    asked = response_format is not None and response_format.type != "text"
    if asked and structured_outputs is not None:
        raise FieldError("give 'response_format' or 'structured_outputs', not both", param="structured_outputs")
    try:
        if asked:
            return _from_response_format(response_format)
        if structured_outputs is not None:
            return _from_structured_outputs(structured_outputs)
    except InvalidConstraintError as exc:
        field = "response_format" if asked else "structured_outputs"
        raise FieldError(f"'{field}': {exc}", param=field) from None
    return None


def _from_response_format(fmt: ResponseFormat) -> Constraint:
    if fmt.type == "json_object":
        return Constraint.json_object()
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise FieldError("'response_format' of type 'json_schema' needs 'json_schema': {'name', 'schema'}",
                       param="response_format.json_schema")
    return Constraint.json_schema(fmt.json_schema.schema_)


def _from_structured_outputs(outputs: StructuredOutputs) -> Constraint:
    given = {name: value for name, value in (("json", outputs.json_), ("regex", outputs.regex),
                                             ("choice", outputs.choice), ("grammar", outputs.grammar),
                                             ("json_object", outputs.json_object or None)) if value is not None}
    if len(given) != 1:
        raise FieldError(f"'structured_outputs' takes exactly one of json, regex, choice, grammar, json_object; "
                            f"got {', '.join(given) or 'none'}", param="structured_outputs")
    [(name, value)] = given.items()
    if name == "json":
        return Constraint.json_schema(value)
    if name == "json_object":
        return Constraint.json_object()
    return {"regex": Constraint.regex, "choice": Constraint.choice, "grammar": Constraint.lark}[name](value)
