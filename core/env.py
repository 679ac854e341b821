"""The one place that reads MINISGL_* environment variables, so every knob is discoverable here."""

from __future__ import annotations

import os
from pathlib import Path


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def home_dir() -> Path:
    """Where converted models are cached: $MINISGL_HOME, else ~/.cache/minisgl."""
    root = os.environ.get("MINISGL_HOME")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "minisgl"


def overlap_scheduling_disabled() -> bool:
    """MINISGL_DISABLE_OVERLAP_SCHEDULING=1 forces the plain receive/forward/handle loop."""
    return _flag("MINISGL_DISABLE_OVERLAP_SCHEDULING")
