"""The model's tokenizer: the one the LLM and the server tokenize with, and the one structured output builds its
token tables from (core/constrain/grammars.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.errors import ModelLoadError, one_line
from core.models.random_spec import ByteTokenizer, RandomSpec
from core.models.weights import declared_tokenizer


def load_tokenizer(model_dir: Path | RandomSpec) -> Any:
    if isinstance(model_dir, RandomSpec):
        return ByteTokenizer()
    from transformers import AutoTokenizer

    try:
        return declared_tokenizer(model_dir) or AutoTokenizer.from_pretrained(model_dir)
    except Exception as exc:
        raise ModelLoadError(f"cannot load the tokenizer from {model_dir}: {one_line(exc)}") from exc
