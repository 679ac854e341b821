"""The local Hugging Face cache, read as files: a model named ORG/NAME is the snapshot its ``refs/main`` names.
Nothing here downloads, asks the network anything or imports torch: the command line reads the cache first."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from core.env import hf_hub_cache

HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_hub_name(model: str) -> bool:
    return HUB_NAME.fullmatch(model) is not None


def hub_repo_dir(name: str, cache: Path | None = None) -> Path:
    """Where the Hugging Face cache keeps ORG/NAME: <cache>/models--ORG--NAME."""
    return (cache or hf_hub_cache()) / ("models--" + name.replace("/", "--"))


def hub_snapshot(name: str, cache: Path | None = None) -> Path | None:
    """The directory of ORG/NAME's current revision in the local Hugging Face cache (the snapshot refs/main
    names, else the only snapshot there is), or None."""
    return _snapshot(hub_repo_dir(name, cache)) if is_hub_name(name) else None


def _snapshot(repo: Path) -> Path | None:
    snapshots = repo / "snapshots"
    try:
        ref = (repo / "refs" / "main").read_text().strip()
    except (OSError, UnicodeDecodeError):
        ref = ""
    if ref and (snapshots / ref).is_dir():
        return snapshots / ref
    found = sorted(p for p in snapshots.iterdir() if p.is_dir()) if snapshots.is_dir() else []
    return found[0] if len(found) == 1 else None


@dataclass(frozen=True)
class CachedModel:
    """A model of the local Hugging Face cache: its name, its snapshot (None when none is usable) and the
    architecture its config.json declares (None without one)."""

    name: str
    path: Path | None
    architecture: str | None


def cached_models(cache: Path | None = None) -> list[CachedModel]:
    """Every model in the local Hugging Face cache (datasets and spaces left out), by name."""
    cache = cache or hf_hub_cache()
    found = []
    for repo in sorted(cache.glob("models--*--*")) if cache.is_dir() else []:
        org, _, name = repo.name[len("models--"):].partition("--")
        snapshot = _snapshot(repo)
        found.append(CachedModel(f"{org}/{name}", snapshot, _architecture(snapshot) if snapshot else None))
    return found


def _architecture(model_dir: Path) -> str | None:
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    archs = config.get("architectures") if isinstance(config, dict) else None
    if isinstance(archs, list) and archs:
        return str(archs[0])
    return str(config.get("model_type")) if isinstance(config, dict) and config.get("model_type") else None
