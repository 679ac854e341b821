"""Engine options, each declared once in ``EngineConfig``: name, type, default, help and check.

``LLM(model, **options)`` and the command line (by name, through ``OPTIONS``) are both made from it. It validates
itself at construction, so a bad value fails before any model loads, and imports no torch, so the command line
checks options before anything heavy."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable

from core.errors import InvalidParamsError
from core.generation import check_source, parse_override

# the named choices (the precision and KV dtype are explained in their options' help)
CACHE_TYPES = ("naive", "radix")
KV_DTYPES = ("auto", "fp8")
ATTENTION_BACKENDS = ("torch", "flashinfer")
PRECISIONS = ("exact", "fast", "int8")
ADMISSION_RULES = ("estimate", "reserve")
DTYPE_NAMES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")  # the names parse_dtype takes


@dataclass(frozen=True)
class Option:
    """How one engine option is typed, checked and explained. ``None`` as a value means "choose for this
    machine" where ``optional``; ``flag`` is its command-line name where that differs from the field's."""

    help: str
    kind: type  # the value's type: int, float, str or bool
    optional: bool = False
    choices: tuple[str, ...] | None = None
    minimum: float | None = None  # an int's least value; a float must be above it
    flag: str | None = None
    noun: str | None = None  # what an unknown choice is called in the error ("attention backend")

    def check(self, name: str, value: Any) -> None:
        if value is None:
            if not self.optional:
                raise InvalidParamsError(f"{name} must be given, got None")
            return
        if self.kind is str and self.choices is not None:
            if value not in self.choices:
                raise InvalidParamsError(f"unknown {self.noun or name} {value!r}; use one of {', '.join(self.choices)}")
            return
        numeric = self.kind in (int, float) and isinstance(value, (int, float) if self.kind is float else int)
        if isinstance(value, bool) is not (self.kind is bool) or not (numeric or isinstance(value, self.kind)):
            raise InvalidParamsError(f"{name} must be {_described(self)}, got {value!r}")
        if self.minimum is not None and not (value > self.minimum if self.kind is float else value >= self.minimum):
            raise InvalidParamsError(f"{name} must be {_described(self)}, got {value!r}")


def _described(opt: Option) -> str:
    kind = {int: "an integer", float: "a number", str: "a string", bool: "True or False"}[opt.kind]
    if opt.minimum is not None:
        kind += f" > {opt.minimum:g}" if opt.kind is float else f" >= {opt.minimum:g}"
    return kind + (" or None" if opt.optional else "")


def option(default: Any, help: str, kind: type, **how: Any) -> Any:
    return field(default=default, metadata={"option": Option(help, kind, **how)})


@dataclass(frozen=True)
class EngineConfig:
    """What the engine is built with."""

    model: str | None = option(
        None, "A Hugging Face model directory, a .gguf file, ORG/NAME of a model in the local Hugging Face cache "
              "(never downloaded) or a random:NAME spec. Default: the embedded "
              "SmolLM2-135M-Instruct.", str, optional=True)
    cache: str = option(
        "radix", "radix shares prompt prefixes; naive frees a request's pages when it ends.", str,
        choices=CACHE_TYPES)
    page_size: int = option(1, "Tokens per KV page.", int, minimum=1)
    max_running_req: int = option(32, "Most requests in one batch.", int, minimum=1, flag="--max-running")
    num_pages: int | None = option(
        None, "KV pool size in pages (default: from --kv-cache-gb); a small pool makes requests wait.", int,
        optional=True, minimum=1)
    kv_cache_gb: float | None = option(
        None, "KV pool memory in GiB (default: what the machine can spare).", float, optional=True, minimum=0)
    max_seq_len: int | None = option(
        None, "Longest prompt + output (default: model's context).", int, optional=True, minimum=1)
    max_extend_tokens: int = option(8192, "Prefill tokens per step; a longer prompt is cut into chunks.", int,
                                    minimum=1)
    dtype: str | None = option(
        None, "float32, bfloat16 or float16 (default: float32 on a CPU, bfloat16 on CUDA).", str, optional=True,
        choices=DTYPE_NAMES, noun="dtype")
    device: str | None = option(None, "cpu, cuda or cuda:N (default: cuda if there is one).", str,
                                optional=True)
    attention: str | None = option(
        None, "torch (any device) or flashinfer (CUDA; the default there when installed).", str, optional=True,
        choices=ATTENTION_BACKENDS, noun="attention backend")
    cuda_graph_max_bs: int | None = option(
        None, "Largest decode batch run as a CUDA graph; 0: none.", int,
        optional=True, minimum=0)
    admission: str = option(
        "estimate", "estimate: admit a request on the KV pages it is expected to need, preempting the newest when "
                    "the pool runs out; reserve: on pages for its whole life, never preempting.", str,
        choices=ADMISSION_RULES, noun="admission rule")
    max_prefill_streak: int = option(
        1, "Prefill steps in a row before decoding requests get a step (a burst of new prompts, a full chunk or "
           "more, is prefilled back to back).", int, minimum=1)
    tp: int = option(1, "Tensor-parallel ranks (processes; GPUs on CUDA).", int, minimum=1)
    threads: int | None = option(
        None, "CPU threads (default: the CPUs this process may use).", int, optional=True, minimum=1)
    overlap: bool | None = option(
        None, "Prepare step N+1 while step N runs (default: on CUDA only).", bool, optional=True)
    kv_dtype: str = option(
        "auto", "KV cache storage: the model's dtype, or fp8 (e4m3, half of bf16's bytes).", str,
        choices=KV_DTYPES)
    precision: str = option(
        "exact", "exact: the model's dtype; fast: reduced-precision weights where this machine runs them "
                 "faster; int8: int8 weights (CPU).", str,
        choices=PRECISIONS)
    generation_config: str = option(
        "auto", "Sampling defaults: auto (the model's generation_config.json), none, or a DIR's.", str)
    override_generation_config: str | None = option(
        None, "JSON over those: temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens.", str,
        optional=True)

    def __post_init__(self) -> None:
        check_options(vars(self))

    @classmethod
    def from_options(cls, **options: Any) -> "EngineConfig":
        """The config from keyword options; an unknown name is refused with the list of valid ones."""
        if unknown := sorted(set(options) - set(OPTIONS)):
            raise InvalidParamsError(f"unknown engine option{'s' if len(unknown) > 1 else ''} "
                                     f"{', '.join(map(repr, unknown))}; valid options: {', '.join(OPTIONS)}")
        return cls(**options)


OPTIONS: dict[str, Option] = {f.name: f.metadata["option"] for f in fields(EngineConfig)}
DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(EngineConfig)}


def check_options(values: dict[str, Any], spell: Callable[[str], str] = str) -> None:
    """Every check of every option, on a full set of values; ``spell`` names an option in the messages (the
    command line says ``--max-running`` where the API says ``max_running_req``)."""
    for name, opt in OPTIONS.items():
        value = values[name]
        if name == "dtype" and value is not None and not isinstance(value, str):
            _check_torch_dtype(value)
        elif name == "generation_config":
            check_source(value, spell(name))
        elif name == "override_generation_config":
            parse_override(value, spell(name))
        else:
            opt.check(spell(name), value.lower() if name == "dtype" and isinstance(value, str) else value)
    pages, rows = values["num_pages"], values["max_running_req"]
    if pages is not None and pages < rows:
        raise InvalidParamsError(f"{spell('num_pages')} {pages} is too small for {spell('max_running_req')} {rows}: "
                                 f"the KV pool needs at least one page per request row")
    if values["device"] is not None:
        _check_device(values["device"])


def _check_device(device: str) -> None:
    import torch

    try:
        torch.device(device)
    except RuntimeError:
        raise InvalidParamsError(f"unknown device {device!r}") from None


def _check_torch_dtype(value: Any) -> None:
    import torch

    if value not in (torch.float32, torch.bfloat16, torch.float16):
        raise InvalidParamsError(f"unknown dtype {value!r}; use one of {', '.join(DTYPE_NAMES)}")


def parse_dtype(value: Any) -> Any:
    """A torch dtype from its name (or the dtype itself); None stays None."""
    import torch

    if value is None or isinstance(value, torch.dtype):
        return value
    if (name := str(value).lower()) not in DTYPE_NAMES:
        raise InvalidParamsError(f"unknown dtype {value!r}; use one of {', '.join(DTYPE_NAMES)}")
    return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
            "float16": torch.float16, "fp16": torch.float16}[name]
