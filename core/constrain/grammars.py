"""Each request's matcher: the tokenizer's tables built once, when the first constrained request arrives, and each
distinct constraint compiled once (a matcher in its start state is kept, and each request gets a copy).

Both take long enough to stall every running stream if the loop's thread did them (the tables: every token's
bytes, tenths of a second for a real tokenizer, core/constrain/tables.py; a grammar: a millisecond, more for a large
schema), so they run on a worker thread of their own, as vLLM and SGLang do: ``request`` answers at once, with a
matcher or None, and the worker calls ``on_ready`` once the grammar is compiled (the scheduler posts that into its
inbox, and the request, which waited in the queue meanwhile, gets its matcher from ``matcher`` on the loop's
thread). Only the worker builds the tables and compiles; only the caller's thread touches what is kept and what is
being built."""

from __future__ import annotations

from collections import OrderedDict
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Iterable

from core.constrain.tables import token_tables
from core.constrain.worker import single_worker
from core.constraint import Constraint
from core.errors import InvalidConstraintError

COMPILED_KEPT = 256  # distinct constraints kept compiled, least recently used dropped first

# the one thread every compile runs on, apart from the masks' own: a long compile never holds up a step's masks
WORKER = "minisgl-grammars"


class Grammars:
    """Matchers for one engine's requests. The tables are built from ``tokenizer_dir``'s tokenizer.json where it
    holds the whole tokenizer, else from what ``tokenizer`` loads (a transformers tokenizer, or a ``random:``
    model's byte tokenizer); either is read once, at the first constrained request, so an engine that never sees
    one never reads it. ``vocab_size`` is the logits' width, ``eos_token_ids`` the tokens a matcher allows only
    once its grammar accepts (read with the tokenizer). ``on_ready(constraint)`` is called on the worker thread
    when a compile that ``request`` started has ended, well or not."""

    def __init__(self, tokenizer: Callable[[], Any], vocab_size: int, eos_token_ids: Callable[[], Iterable[int]],
                 on_ready: Callable[[Constraint], None] = lambda constraint: None, *,
                 tokenizer_dir: Path | None = None) -> None:
        self._load_tokenizer = tokenizer
        self._tokenizer_dir = tokenizer_dir
        self.vocab_size = vocab_size
        self._eos_token_ids = eos_token_ids
        self._on_ready = on_ready
        self._info: Any = None
        # each constraint's matcher in its start state, or the error that says why it cannot be built
        self._compiled: OrderedDict[Constraint, Any] = OrderedDict()
        self._building: dict[Constraint, Future] = {}  # compiles running on the worker, until ``matcher`` takes them

    def request(self, constraint: Constraint) -> Any:
        """A matcher of its own for a request under ``constraint`` if its grammar is compiled; else None, and the
        worker compiles it (once, however many requests ask) and then calls ``on_ready(constraint)``, after which
        ``matcher`` answers at once. Raises InvalidConstraintError where the grammar is known not to build."""
        if constraint in self._compiled:
            return self.matcher(constraint)
        if constraint not in self._building:
            self._building[constraint] = single_worker(WORKER).submit(self._compile, constraint)
            self._building[constraint].add_done_callback(lambda _: self._on_ready(constraint))
        return None

    def matcher(self, constraint: Constraint) -> Any:
        """A matcher of its own for one request, at the start of ``constraint``'s grammar (compiled first, on the
        worker, if need be). Raises InvalidConstraintError where the grammar cannot be built for this tokenizer."""
        start = self.settle(constraint)
        if isinstance(start, InvalidConstraintError):
            raise InvalidConstraintError(str(start))
        return start.deep_copy()

    def settle(self, constraint: Constraint) -> Any:
        """Keep what the worker compiled for ``constraint`` (waiting for it if it is still at work; compiling it if
        nobody asked yet), also when no request waits for it any more; return it: the matcher in its start state,
        or the InvalidConstraintError saying why there is none."""
        start = self._compiled.get(constraint)
        if start is None:
            building = self._building.pop(constraint, None) or single_worker(WORKER).submit(self._compile, constraint)
            start = self._compiled[constraint] = building.result()
            if len(self._compiled) > COMPILED_KEPT:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(constraint)
        return start

    def _compile(self, constraint: Constraint) -> Any:
        """On the worker: the matcher in ``constraint``'s start state, or the error saying why there is none."""
        from llguidance import LLMatcher

        start = LLMatcher(self.tokenizer_info(), constraint.grammar, log_level=0)
        if start.is_error():
            return InvalidConstraintError(f"{constraint.describe()} cannot be used: {start.get_error()}")
        return start

    def tokenizer_info(self) -> Any:
        """llguidance's view of the vocabulary (every token's bytes), built on first use (on the worker)."""
        if self._info is None:
            eos = sorted(self._eos_token_ids())
            self._info = token_tables(self._tokenizer_dir, self._load_tokenizer, self.vocab_size, eos)
        return self._info
