"""Requests that leave before they finish: aborted wherever they are, or stuck at the head of the queue because
they can never fit. Either way their row and pages come back and they get their one final reply."""

from __future__ import annotations

from typing import Callable

from core.arith import pages_for
from core.request import Req
from core.scheduler.decode import DecodeManager
from core.scheduler.prefill import PrefillManager
from core.scheduler.reply import Reply


def take_out(uid: int, prefill: PrefillManager, decode: DecodeManager, release: Callable[[Req], None]) -> bool:
    """Remove request ``uid`` wherever it is (queued, part way through its prompt, preempted, decoding), freeing
    what it holds; False if there is no such request."""
    pending = prefill.find(uid)
    if pending is not None:
        prefill.remove(pending)
        req = pending.admitted
    else:
        req = decode.find(uid)
        if req is None:
            return False
        decode.remove(req)
    if req is not None:
        req.done = True  # a batch in flight may still hold it: its result is dropped
        release(req)
    return True


def stuck_head(prefill: PrefillManager, decode: DecodeManager, release: Callable[[Req], None], page_size: int,
               num_pages: int) -> Reply | None:
    """Nothing could be scheduled while requests wait and none decode: the head can never fit. Take it out and
    return its error reply (None when nobody is stuck). One waiting for its grammar is not stuck: it is passed."""
    if decode.runnable or not prefill.runnable:
        return None
    pending = next(p for p in prefill.pending if not p.awaits_grammar)
    prefill.remove(pending)
    if pending.admitted is not None:
        release(pending.admitted)
    return Reply(pending.uid, None, True, "error", f"request needs more KV pages than the pool can ever free "
                 f"({pages_for(pending.max_kv_len, page_size)} needed, {num_pages} in the pool)")
