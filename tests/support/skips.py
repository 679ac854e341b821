"""The suite's last line: how many tests skipped, and why, counted by reason (the run's end, in one line)."""

from __future__ import annotations

from collections import Counter
from typing import Any


def skip_reason(report: Any) -> str:
    """A skipped test's reason, as pytest keeps it: (path, line, 'Skipped: why')."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def skip_line(skipped: list[Any], ran: int) -> str:
    """``skipped 3 of 120: 2 needs CUDA; 1 tmux is not installed`` (most common reason first); '' if none."""
    if not skipped:
        return ""
    counts = Counter(skip_reason(report) for report in skipped)
    return f"skipped {len(skipped)} of {ran}: " + "; ".join(f"{n} {reason}" for reason, n in counts.most_common())
