"""minisgl's engine: continuous batching over a paged KV cache, with an ``LLM`` interface that takes requests
while it runs. ``LLM`` is imported on first use (PEP 562), so importing ``core`` for its errors or options costs
no torch or transformers, which lets ``minisgl --help`` answer at once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core import env
from core.cpu_share import busy_now

env.let_idle_threads_sleep(busy_now())  # before torch loads libgomp, which reads its spin count once

from core.config import EngineConfig  # noqa: E402
from core.errors import (ContextLengthError, EngineBusyError, EngineDeadError, InvalidParamsError, MinisglError,
                         ModelLoadError, PromptFileError, RequestRejected, UnsupportedModelError, WorkerError)
from core.events import ReqStep, StepEvent
from core.request import Prompt, Result, SamplingParams

if TYPE_CHECKING:
    from core.llm import LLM

__version__ = "0.1.0"

__all__ = ["LLM", "Prompt", "Result", "SamplingParams", "StepEvent", "ReqStep", "MinisglError",
           "InvalidParamsError", "EngineBusyError", "ModelLoadError", "PromptFileError", "UnsupportedModelError",
           "WorkerError", "RequestRejected", "ContextLengthError", "EngineDeadError", "EngineConfig", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from core.llm import LLM

        return LLM
    raise AttributeError(f"module 'core' has no attribute {name!r}")
