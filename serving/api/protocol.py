"""The request bodies of the OpenAI API that the server takes, and how each becomes SamplingParams.

Every field an OpenAI client may send is declared. Those the engine cannot honour (``best_of``,
``echo``...) are refused with a 400 that names them when they ask for something other than
the default, never silently ignored; a field nobody knows is refused too (a typo must not pass unnoticed).
``top_k``, ``ignore_eos``, ``repetition_penalty``, ``min_p``, ``min_tokens`` and ``stop_token_ids`` are the usual
extensions (vLLM's; the openai client sends them through ``extra_body``).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr

from core import SamplingParams
from core.constraint import Constraint
from core.errors import InvalidConstraintError, InvalidParamsError
from core.generation import SamplingDefaults
from serving.api.structured import FieldError, ResponseFormat, StructuredOutputs, constraint_of
from serving.api.tools import Tool, ToolChoice, ToolMode, tool_mode


MAX_CHOICES = 128  # OpenAI's own bound on n
# a list the server validates item by item is counted first: pydantic holds the interpreter lock while it
# validates, so a list of 100,000 parts would stall every stream while it is validated (docs/RELIABILITY.md)
MAX_MESSAGES = 4096
MAX_PARTS = 4096  # content parts of one message
API_PATHS = ("/v1/", "/tokenize", "/detokenize")  # what --api-key guards and --log-requests logs

# a token count as a JSON number, never a string that holds one: "5" is refused, as OpenAI's API refuses it
TokenCount = Annotated[Optional[int], Field(strict=True)]


class ApiError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def at_most(limit: int, what: str) -> BeforeValidator:
    """A list of more than ``limit`` items is refused before any item is validated."""
    def check(value: Any) -> Any:
        if isinstance(value, list) and len(value) > limit:
            raise ValueError(f"at most {limit:,} {what}, got {len(value):,}")
        return value

    return BeforeValidator(check)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # NaN, Infinity and 1e999 are not numbers


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Common(_Strict):
    model: str
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: Union[str, list[str], None] = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)  # choices per prompt, each its own engine request
    # the logits controls (SamplingParams checks them): None leaves each off
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # token id (a string, as JSON's keys are) -> bias
    min_p: float | None = None
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    CONTROLS: ClassVar[tuple[str, ...]] = ("presence_penalty", "frequency_penalty", "repetition_penalty",
                                           "logit_bias", "min_p", "min_tokens", "stop_token_ids")
    user: str | None = None
    response_format: ResponseFormat | None = None  # OpenAI's: a JSON schema, or any JSON object
    structured_outputs: StructuredOutputs | None = None  # vLLM's: json, regex, choice or grammar

    def _refuse_unsupported(self, extra: dict[str, bool]) -> None:
        for name, asked in extra.items():
            if asked:
                raise ApiError(400, f"'{name}' is not supported by this server (value: {getattr(self, name)!r})",
                               param=name)
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "'stream_options' is only allowed with stream: true", param="stream_options")
        if self.stream_options is not None and self.stream_options.continuous_usage_stats and not self.include_usage:
            raise ApiError(400, "'stream_options.continuous_usage_stats' needs 'include_usage': true",
                           param="stream_options")

    def sampling_params(self, room: int, defaults: SamplingDefaults) -> SamplingParams:
        """``room``: the most tokens the context and the pool leave the prompt; ``defaults``: the model's."""
        raise NotImplementedError

    def _constraint(self) -> Constraint | None:
        """What the output must match (serving/api/structured.py), checked here: a 400 before anything is queued."""
        try:
            return constraint_of(self.response_format, self.structured_outputs)
        except FieldError as exc:
            raise ApiError(400, exc.message, param=exc.param) from None

    def choice_params(self, room: int, defaults: SamplingDefaults) -> list[SamplingParams]:
        """The ``n`` choices' params: alike, but a seed given is the first choice's, the next one's is one more
        and so on, so that the choices differ and each is reproducible alone."""
        params = self.sampling_params(room, defaults)
        if params.seed is None:
            return [params] * self.n
        return [dataclasses.replace(params, seed=params.seed + i) for i in range(self.n)]

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def usage_in_every_chunk(self) -> bool:
        """``continuous_usage_stats`` (vLLM's): every chunk carries the counts so far, not only the last."""
        return self.include_usage and self.stream_options.continuous_usage_stats

    def _params(self, max_tokens: int, logprobs: int | None, defaults: SamplingDefaults) -> SamplingParams:
        """What the request gave; for a field it left out, the model's default (its generation config) where it
        has one, else the field's own here (OpenAI's: temperature 1)."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        own = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed,
               "ignore_eos": self.ignore_eos, "stop": tuple(stop),
               **{name: getattr(self, name) for name in self.CONTROLS}}
        model = {name: value for name, value in defaults.values.items()
                 if name != "max_tokens" and name not in self.model_fields_set}
        values = {**{name: value for name, value in own.items() if value is not None}, **model}
        try:
            return SamplingParams(max_tokens=max_tokens, logprobs=logprobs, constraint=self._constraint(), **values)
        except InvalidParamsError as exc:  # its messages start with the field's name
            raise ApiError(400, str(exc), param=str(exc).split(" ", 1)[0]) from None


Prompt = Union[str, list[int], list[str], list[list[int]]]


class CompletionRequest(_Common):
    prompt: Prompt
    max_tokens: TokenCount = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def prompt_list(self) -> list[str | list[int]]:
        """The prompts: one text or token list, or a list of several (their choices come in this order)."""
        prompt = self.prompt
        several = isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list))
        prompts = list(prompt) if several else [prompt]
        for i, one in enumerate(prompts):
            if not one:
                raise ApiError(400, f"'prompt{f'.{i}' if several else ''}' is empty", param="prompt")
        return prompts

    def sampling_params(self, room: int, defaults: SamplingDefaults) -> SamplingParams:
        self._refuse_unsupported({"echo": self.echo, "suffix": self.suffix is not None,
                                  "best_of": self.best_of not in (None, 1)})
        max_tokens = self.max_tokens if self.max_tokens is not None else room  # null: what the context leaves
        if "max_tokens" not in self.model_fields_set and "max_tokens" in defaults.values:
            max_tokens = min(defaults.values["max_tokens"], room)  # left out: the model's default, else 16
        return self._params(max_tokens, self.logprobs, defaults)


class ContentPart(BaseModel):
    """One part of a message's content. Only text parts can be read; any other (an image, audio, a file) is
    refused by its type rather than by the shape pydantic could not match."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")  # e.g. 'name': passed on to the chat template

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Annotated[Union[str, list[ContentPart], None], at_most(MAX_PARTS, "content parts")] = None

    def as_template_message(self, where: str) -> dict[str, Any]:
        """The message as the chat template takes it; ``where`` ('messages.3') names it in an error."""
        content = self.content
        if isinstance(content, list):
            for part in content:
                if part.type != "text":
                    raise ApiError(400, f"'{where}.content': a part of type '{part.type}' cannot be read; this "
                                        f"server takes text parts only", param=f"{where}.content")
                if part.text is None:
                    raise ApiError(400, f"'{where}.content': a text part without 'text'", param=f"{where}.content")
            content = "".join(part.text or "" for part in content)
        role = "system" if self.role == "developer" else self.role
        return {**(self.model_extra or {}), "role": role, "content": content or ""}


def template_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """A request's messages as the chat template takes them, each named 'messages.N' in an error."""
    return [m.as_template_message(f"messages.{i}") for i, m in enumerate(messages)]


class ChatRequest(_Common):
    messages: Annotated[list[Message], Field(min_length=1), at_most(MAX_MESSAGES, "messages")]
    max_tokens: TokenCount = None
    max_completion_tokens: TokenCount = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None
    # labels and hints that change no token: accepted, as 'user' is
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # accepted at the values that ask for what this server does anyway
    store: bool | None = None
    service_tier: str | None = None
    modalities: list[str] | None = None
    # features of OpenAI's own models and platform, refused whenever given
    PLATFORM_FIELDS: ClassVar[tuple[str, ...]] = (
        "audio", "prediction", "reasoning_effort", "verbosity", "web_search_options", "moderation",
        "prompt_cache_retention", "prompt_cache_options")
    audio: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    moderation: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    _tool_mode: ToolMode = PrivateAttr(default_factory=lambda: ToolMode("none"))

    def sampling_params(self, room: int, defaults: SamplingDefaults) -> SamplingParams:
        self._refuse_unsupported({"functions": bool(self.functions), "function_call": self.function_call is not None,
                                  "store": bool(self.store),
                                  "service_tier": self.service_tier not in (None, "auto", "default"),
                                  "modalities": self.modalities not in (None, ["text"]),
                                  **{name: getattr(self, name) is not None for name in self.PLATFORM_FIELDS}})
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        limit = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        if limit is None:  # the model's default where it has one, else what the context leaves
            limit = min(defaults.values.get("max_tokens", room), room)
        return self._params(limit, logprobs, defaults)

    def read_tools(self, template: str | None) -> ToolMode:
        """How the reply is read for tools (serving/api/tools.py), decided before the prompt is made; a 400 names
        what cannot be honoured."""
        try:
            self._tool_mode = tool_mode(self.tools, self.tool_choice, template)
        except FieldError as exc:
            raise ApiError(400, exc.message, param=exc.param) from None
        return self._tool_mode

    def _constraint(self) -> Constraint | None:
        """Under ``required`` or a named function, the calls (which response_format cannot also shape)."""
        try:
            calls = self._tool_mode.constraint(self.tools or [], self.parallel_tool_calls is not False)
        except InvalidConstraintError as exc:
            raise ApiError(400, f"'tools': {exc}", param="tools") from None
        if calls is None:
            return super()._constraint()
        if super()._constraint() is not None:
            raise ApiError(400, f"tool_choice '{self._tool_mode.kind}' shapes the reply as calls: it cannot also "
                                f"follow 'response_format' or 'structured_outputs'", param="tool_choice")
        return calls


class TokenizeRequest(_Strict):
    """``POST /tokenize`` (as vLLM's): a prompt, or chat messages through the model's template, as the completions
    and chat endpoints would tokenize them."""

    model: str
    prompt: Union[str, list[int], None] = None
    messages: Annotated[Optional[list[Message]], at_most(MAX_MESSAGES, "messages")] = None
    add_generation_prompt: bool = True


class DetokenizeRequest(_Strict):
    """``POST /detokenize`` (as vLLM's): token ids back to text."""

    model: str
    tokens: list[int]
