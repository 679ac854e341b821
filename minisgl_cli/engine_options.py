"""The engine's options on the command line, made from EngineConfig's one list (core/config.py) by name.

``with_engine_options`` adds one command-line option per EngineConfig field to a command's signature (its
flag, type, default, help and choices come from the field's declaration) and hands the command what was typed
as one ``EngineOptions``. So a new engine option appears in every command that loads a model, and no command
lists them by position.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal, Optional, get_type_hints

import typer

from core.config import DEFAULTS, OPTIONS, Option, check_options
from core.models.weights import check_model_path

PANEL = "Engine"
SAMPLING_PANEL = "Sampling"  # the model's sampling defaults are shown beside the sampling options
SAMPLING_DEFAULTS = ("generation_config", "override_generation_config")
# how the model option reads on the command line: a path or spec, and -m for short
_MODEL_HELP = ("A model directory, a .gguf file, ORG/NAME in the local Hugging Face cache (never downloaded) or "
               "random:NAME. Default: the embedded SmolLM2-135M-Instruct.")


def flag(name: str) -> str:
    """The command line's name of an engine option: ``max_running_req`` is ``--max-running``."""
    return OPTIONS[name].flag or "--" + name.replace("_", "-")


@dataclass(frozen=True)
class EngineOptions:
    """The engine options of one command, by EngineConfig's names (every option, typed or default)."""

    values: dict[str, Any]

    @property
    def model(self) -> str | None:
        return self.values["model"]

    @property
    def cache(self) -> str:
        return self.values["cache"]

    def given(self) -> dict[str, Any]:
        """The options that differ from their defaults: what ``LLM(**options)`` needs."""
        return {name: value for name, value in self.values.items() if value != DEFAULTS[name] and name != "model"}

    def check(self) -> None:
        """Every check EngineConfig makes, and that the model's path or name exists, before anything is loaded, in
        the words of the command line."""
        check_options(self.values, spell=flag)
        check_model_path(self.model)

    @classmethod
    def defaults(cls, **values: Any) -> "EngineOptions":
        return cls({**DEFAULTS, **values})


def engine_option(name: str) -> Any:
    """One engine option's command-line declaration, for a command that takes only some of them."""
    return _annotation(name, OPTIONS[name])


def _annotation(name: str, opt: Option) -> Any:
    # a dtype's names are matched in any case: EngineConfig checks it, not a Literal
    kind: Any = Literal[opt.choices] if opt.choices and name != "dtype" else opt.kind  # type: ignore[valid-type]
    if opt.optional:
        kind = Optional[kind]
    decls = [flag(name)]
    extra: dict[str, Any] = {}
    if name == "model":
        decls.append("-m")
        extra["metavar"] = "PATH"
    if opt.kind is bool:
        decls = [f"{flag(name)}/--no-{flag(name)[2:]}"]
        extra["metavar"] = ""
        extra["show_default"] = False
    if opt.minimum is not None and opt.kind is int:
        extra["min"] = int(opt.minimum)
    help_text = _MODEL_HELP if name == "model" else opt.help
    panel = SAMPLING_PANEL if name in SAMPLING_DEFAULTS else PANEL
    return Annotated[kind, typer.Option(*decls, rich_help_panel=panel, help=help_text, **extra)]


def with_engine_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The command with every engine option added to its signature; it receives them as ``engine``."""
    signature = inspect.signature(command)
    hints = get_type_hints(command, include_extras=True)
    own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in signature.parameters.values()
           if p.name != "engine"]
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=DEFAULTS[name],
                               annotation=_annotation(name, opt)) for name, opt in OPTIONS.items()]

    @functools.wraps(command)
    def run(**kwargs: Any) -> Any:
        engine = EngineOptions({name: kwargs.pop(name) for name in OPTIONS})
        return command(engine=engine, **kwargs)

    run.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind is p.POSITIONAL_OR_KEYWORD else p
                    for p in own] + added)
    run.__annotations__ = {p.name: p.annotation for p in own + added}
    return run
