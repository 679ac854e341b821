"""The options every command shares, declared once as annotated types, and the values they collect into.

The engine's options are not declared here: they are EngineConfig's (core/config.py), given to a command by
``with_engine_options`` (minisgl_cli/engine_options.py).

Sampling options default to None, meaning "not given": a prompt file's per-prompt values apply then, and a
value typed on the command line overrides them for every prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from core.constraint import Constraint

# the metavar of an on/off option: nothing (Typer would show "<bool>", as if it took a value)
FLAG = ""

_ENGINE = "Engine"
_SAMPLING = "Sampling"

Verbose = Annotated[bool, typer.Option(
    "--verbose", metavar=FLAG, rich_help_panel="Engine",
    help="Describe the engine's plan on stderr.")]
Chat = Annotated[bool, typer.Option("--chat", metavar=FLAG, rich_help_panel=_ENGINE,
                                    help="Wrap each text prompt in the model's chat template.")]

MaxTokens = Annotated[Optional[int], typer.Option(
    "--max-tokens", "-n", min=1, rich_help_panel=_SAMPLING,
    help="Tokens to generate per prompt (default: the file's, else the model's, else 16).")]
Temperature = Annotated[Optional[float], typer.Option(
    "--temperature", "-t", min=0.0, rich_help_panel=_SAMPLING,
    help="0 is greedy (default: the file's, else the model's, else 0).")]
TopK = Annotated[Optional[int], typer.Option("--top-k", rich_help_panel=_SAMPLING,
                                             help="Sample from the k most likely tokens; -1 is off (default: -1).")]
TopP = Annotated[Optional[float], typer.Option("--top-p", rich_help_panel=_SAMPLING,
                                               help="Nucleus sampling, in (0, 1] (default: 1).")]
Seed = Annotated[Optional[int], typer.Option("--seed", rich_help_panel=_SAMPLING,
                                             help="Seed for sampling (per request: same seed, same output).")]
IgnoreEos = Annotated[Optional[bool], typer.Option(
    "--ignore-eos/--stop-at-eos", metavar=FLAG, rich_help_panel=_SAMPLING, show_default=False,
    help="Keep generating after an end-of-sequence token (default: the file's value, else stop).")]
Stop = Annotated[Optional[list[str]], typer.Option(
    "--stop", metavar="TEXT", rich_help_panel=_SAMPLING, show_default=False,
    help="End a prompt's text at this string (cut before it); repeat for several.")]
PresencePenalty = Annotated[Optional[float], typer.Option(
    "--presence-penalty", rich_help_panel=_SAMPLING,
    help="Subtract this (-2 to 2) once from the logit of each token generated so far.")]
FrequencyPenalty = Annotated[Optional[float], typer.Option(
    "--frequency-penalty", rich_help_panel=_SAMPLING,
    help="Subtract this (-2 to 2) times its count from each generated token's logit.")]
RepetitionPenalty = Annotated[Optional[float], typer.Option(
    "--repetition-penalty", rich_help_panel=_SAMPLING,
    help="Scale down the logits of every token in the prompt or output by this, > 0, as transformers does.")]
LogitBias = Annotated[Optional[list[str]], typer.Option(
    "--logit-bias", metavar="ID=BIAS", rich_help_panel=_SAMPLING, show_default=False,
    help="Add BIAS (-100 to 100) to token ID's logit; 100 forces it, -100 bans it. Repeat for several.")]
MinP = Annotated[Optional[float], typer.Option(
    "--min-p", rich_help_panel=_SAMPLING,
    help="Sample only tokens at least this fraction (0 to 1) as likely as the likeliest.")]
MinTokens = Annotated[Optional[int], typer.Option(
    "--min-tokens", rich_help_panel=_SAMPLING,
    help="Hold back end-of-sequence and stop tokens until this many are generated.")]
StopTokenId = Annotated[Optional[list[int]], typer.Option(
    "--stop-token-id", metavar="ID", rich_help_panel=_SAMPLING, show_default=False,
    help="End a prompt when this token is generated, as end-of-sequence does; repeat for several.")]
JsonSchema = Annotated[Optional[Path], typer.Option(
    "--json-schema", metavar="FILE", rich_help_panel=_SAMPLING, show_default=False,
    help="Constrain every output to the JSON schema in FILE (structured output).")]
Regex = Annotated[Optional[str], typer.Option(
    "--regex", metavar="PATTERN", rich_help_panel=_SAMPLING, show_default=False,
    help="Constrain every output to match this regular expression.")]
Logprobs = Annotated[Optional[int], typer.Option(
    "--logprobs", min=0, max=20, rich_help_panel=_SAMPLING,
    help="With --json: each token's logprob and the N most likely alternatives.")]

Prompts = Annotated[Path, typer.Argument(
    metavar="PROMPTS", show_default=False,
    help="A .txt file (one prompt a line) or .jsonl file (one object a line, keys in the README); '-': stdin.")]
OptionalPrompts = Annotated[Optional[Path], typer.Argument(
    metavar="PROMPTS", show_default=False,
    help="A .txt or .jsonl prompts file, or '-' for stdin. Default: the tutorial's five prompts "
         "(sample_prompts/chapter.jsonl).")]
Stream = Annotated[Optional[bool], typer.Option(
    "--stream/--no-stream", metavar=FLAG, show_default=False,
    help="Write each continuation as its tokens are produced (default: on a terminal with a single prompt).")]
Json = Annotated[bool, typer.Option("--json", metavar=FLAG, help="Print one JSON object per prompt instead of tables.")]


@dataclass(frozen=True)
class SamplingOptions:
    max_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    ignore_eos: bool | None = None
    stop: tuple[str, ...] | None = None
    logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: tuple[str, ...] | None = None  # ID=BIAS, as typed
    min_p: float | None = None
    min_tokens: int | None = None
    stop_token_ids: tuple[int, ...] | None = None
    constraint: Constraint | None = None  # --json-schema or --regex

    def explicit(self) -> dict[str, Any]:
        """Only the options that were given, by SamplingParams field name."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}  # asdict would unmake the constraint
        given = {key: value for key, value in values.items() if value is not None and value != ()}
        if "logit_bias" in given:
            given["logit_bias"] = dict(_bias(pair) for pair in given["logit_bias"])
        return given


def output_constraint(json_schema: Path | None, regex: str | None) -> Constraint | None:
    """--json-schema FILE or --regex PATTERN (one at most) as the engine's constraint; a file that cannot be read is
    a usage error, a schema or pattern that is wrong an InvalidConstraintError naming what is wrong."""
    if json_schema is not None and regex is not None:
        raise typer.BadParameter("give --json-schema or --regex, not both", param_hint="'--regex'")
    if regex is not None:
        return Constraint.regex(regex)
    if json_schema is None:
        return None
    try:
        text = json_schema.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise typer.BadParameter(f"cannot read {json_schema}: {getattr(exc, 'strerror', None) or exc}",
                                 param_hint="'--json-schema'") from None
    return Constraint.json_schema(text)


def _bias(typed: str) -> tuple[Any, Any]:
    """'ID=BIAS' as (id, bias); what is not numbers is left for SamplingParams to refuse by name."""
    token, sep, bias = typed.partition("=")
    if not sep:
        raise typer.BadParameter(f"{typed!r} is not ID=BIAS (a token id and a number)", param_hint="'--logit-bias'")
    try:
        return token.strip(), float(bias)
    except ValueError:
        raise typer.BadParameter(f"{typed!r}: the bias {bias!r} is not a number",
                                 param_hint="'--logit-bias'") from None
