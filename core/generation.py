"""The model's sampling defaults: what a request that omits a sampling field gets, as vLLM takes them.

``generation_config`` says where they come from: 'auto', the model directory's generation_config.json (a converted
GGUF's has one, without sampling fields; a ``random:`` model has none); 'none', no file; or a directory holding one.
``override_generation_config`` (a JSON object, or a dict from Python) sets fields over the file's. Both use
transformers' names; of them only those below are read, as vLLM reads them, ``max_new_tokens`` becoming
``max_tokens`` (a ``top_k`` of 0, transformers' "off", is -1). A request's own value always wins; the defaults are
decided once, when the LLM or the server is built, and said in one line (``SamplingDefaults.describe``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core.errors import InvalidParamsError
from core.request import SamplingParams

# transformers' name -> SamplingParams' name
GENERATION_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                     "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
SOURCES = ("auto", "none")  # or a directory
FILE = "generation_config.json"


@dataclass(frozen=True)
class SamplingDefaults:
    """Defaults by SamplingParams' names, and where they came from, in words."""

    values: dict[str, Any] = field(default_factory=dict)
    source: str = "none"

    def params(self, base: dict[str, Any] | None = None, **given: Any) -> SamplingParams:
        """A request's params: ``base`` (the caller's own defaults: the server's are OpenAI's), then these
        defaults, then what the request gave (None: not given)."""
        return SamplingParams(**{**(base or {}), **self.values,
                                 **{name: value for name, value in given.items() if value is not None}})

    def describe(self) -> str:
        if not self.values:
            return f"sampling defaults: the engine's own ({self.source})"
        fields = ", ".join(f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}"
                           for name, value in self.values.items())
        return f"sampling defaults: {fields} ({self.source})"


def parse_override(override: str | dict[str, Any] | None, name: str = "override_generation_config") -> dict[str, Any]:
    """The override as SamplingParams' names, checked: a JSON object of the fields above with valid values."""
    if override is None:
        return {}
    if isinstance(override, str):
        try:
            override = json.loads(override)
        except json.JSONDecodeError as exc:
            raise InvalidParamsError(f"{name} is not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(override, dict):
        raise InvalidParamsError(f"{name} must be a JSON object of generation fields, got {override!r}")
    return _checked(override, name)


def check_source(source: str, name: str = "generation_config") -> None:
    if not isinstance(source, str) or (source not in SOURCES and not (Path(source) / FILE).is_file()):
        raise InvalidParamsError(f"{name} must be 'auto', 'none' or a directory holding a {FILE}, got {source!r}")


def sampling_defaults(model_dir: Path | None, source: str = "auto",
                      override: str | dict[str, Any] | None = None) -> SamplingDefaults:
    """The defaults for requests to the model in ``model_dir`` (None: a model without files, a ``random:`` one)."""
    check_source(source)
    where = None if source == "none" else model_dir if source == "auto" else Path(source)
    path = where / FILE if where is not None and (where / FILE).is_file() else None
    named = f"the model's {FILE}" if source == "auto" else str(path)
    values, sources = {}, []
    if path is not None:
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidParamsError(f"{path} is not valid JSON: {exc}") from None
        values = _checked({k: v for k, v in data.items() if k in GENERATION_FIELDS and v is not None}, str(path))
        sources += [named] if values else []
    extra = parse_override(override)
    if extra:
        values = {**values, **extra}
        sources.append("the override")
    if sources:
        words = "from " + " and ".join(sources)
    else:
        words = ("no generation config" if source == "none" else f"{named} sets none" if path is not None
                 else "the model has no generation config")
    return SamplingDefaults(values, words)


def _checked(fields: dict[str, Any], where: str) -> dict[str, Any]:
    unknown = sorted(set(fields) - set(GENERATION_FIELDS))
    if unknown:
        raise InvalidParamsError(f"{where}: unknown field {unknown[0]!r}; the fields read are "
                                 f"{', '.join(GENERATION_FIELDS)}")
    values = {GENERATION_FIELDS[name]: value for name, value in fields.items()}
    if values.get("top_k") == 0:
        values["top_k"] = -1
    try:
        replace(SamplingParams(max_tokens=values.get("max_tokens", 1)), **values)
    except (InvalidParamsError, TypeError) as exc:
        raise InvalidParamsError(f"{where}: {exc}") from None
    return values
