"""The benchmark's named baselines, apart from the runner so that the command line's help lists them without
importing torch."""

from __future__ import annotations

from typing import Sequence

from core.errors import InvalidParamsError

BASELINES = ("hf-sequential", "hf-static", "hf-continuous")
# one long request at a time says little on a GPU and takes minutes there
CUDA_BASELINES = ("hf-static", "hf-continuous")

# what each stage's progress counts: the engine reports output tokens, hf-static its decoding steps (it returns
# nothing before the whole batch is done), the other two finished requests
STAGE_UNITS = {"minisgl": "tokens", "hf-sequential": "requests", "hf-static": "steps", "hf-continuous": "requests"}


def parse_baselines(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """The baselines asked for, in BASELINES' order; None (the device's default) when none were given."""
    if value is None:
        return None
    names = [n.strip() for n in value.split(",") if n.strip()] if isinstance(value, str) else list(value)
    valid = ", ".join(BASELINES)
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise InvalidParamsError(f"unknown baseline {unknown[0]!r}; use a comma-separated subset of {valid}")
    if not names:
        raise InvalidParamsError(f"no baseline named; use a comma-separated subset of {valid}")
    return tuple(n for n in BASELINES if n in names)
