"""minisgl's engine: continuous batching over a paged KV cache, with an ``LLM`` interface that takes requests while it runs."""

from core.errors import (EngineBusyError, InvalidParamsError, MinisglError, ModelLoadError, PromptFileError,
                         UnsupportedModelError, WorkerError)
from core.events import ReqStep, StepEvent
from core.llm import LLM
from core.request import SamplingParams

__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "StepEvent", "ReqStep", "MinisglError", "InvalidParamsError",
           "EngineBusyError", "ModelLoadError", "PromptFileError", "UnsupportedModelError", "WorkerError", "__version__"]
