"""minisgl's engine: continuous batching over a paged KV cache, with an offline ``LLM`` interface."""

from core.errors import (InvalidParamsError, MinisglError, ModelLoadError, PromptFileError, UnsupportedModelError,
                         WorkerError)
from core.events import ReqStep, StepEvent
from core.llm import LLM
from core.request import SamplingParams

__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "StepEvent", "ReqStep", "MinisglError", "InvalidParamsError",
           "ModelLoadError", "PromptFileError", "UnsupportedModelError", "WorkerError", "__version__"]
