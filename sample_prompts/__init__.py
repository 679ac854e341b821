"""Prompt files shipped with minisgl: the default set for ``minisgl trace`` and ``verify``, and examples.

A package only so that an installed ``minisgl`` finds them with importlib.resources.
"""

from importlib.resources import files
from pathlib import Path

DEFAULT_SET = "chapter.jsonl"


def path(name: str = DEFAULT_SET) -> Path:
    """The path of a shipped prompt file."""
    return Path(str(files(__name__) / name))
