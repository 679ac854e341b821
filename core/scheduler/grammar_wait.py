"""Requests whose grammar is being compiled (core/constrain/grammars.py, on a worker thread) wait in the queue
without holding it up (core/scheduler/prefill.py); the worker's GrammarReady message, taken in at the top of a
step, gives each of them its matcher, after which it is admitted like any other, or answers it with the error
that says why its grammar cannot be built."""

from __future__ import annotations

from typing import Any

from core.constrain.grammars import Grammars
from core.constraint import Constraint
from core.errors import InvalidConstraintError, MinisglError, RequestRejected
from core.request import SamplingParams
from core.scheduler.prefill import PrefillManager
from core.scheduler.reply import Reply


def matcher_or_error(params: SamplingParams, grammars: Grammars,
                     rejected: RequestRejected | None) -> tuple[Any, MinisglError | None]:
    """What a request arriving with ``params`` is queued with: its own matcher (None without a constraint, and
    while its grammar compiles), or instead the error it is answered with: ``rejected``, why it can never run here
    (then no compile starts for it), or why its grammar cannot be built."""
    if rejected is not None or params.constraint is None:
        return None, rejected
    try:
        return grammars.request(params.constraint), None
    except InvalidConstraintError as exc:
        return None, exc


def grammar_ready(constraint: Constraint, prefill: PrefillManager, grammars: Grammars) -> list[Reply]:
    """Hand the compiled ``constraint`` to every request queued under it; the error replies of those it fails.
    Requests aborted meanwhile are gone from the queue: the compile is kept for the next one that asks."""
    grammars.settle(constraint)
    replies: list[Reply] = []
    for pending in [p for p in prefill.pending if p.awaits_grammar and p.params.constraint == constraint]:
        try:
            pending.matcher = grammars.matcher(constraint)
        except InvalidConstraintError as exc:
            prefill.remove(pending)
            replies.append(Reply(pending.uid, None, True, "error", str(exc)))
    return replies
