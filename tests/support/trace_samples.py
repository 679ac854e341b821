"""Step events as the scheduler reports them, built by hand: a run where requests arrive while others run,
wait for a table row and for KV pages, share a cached prefix, and finish, with the KV pool's parts and the
radix tree filled in. The trace views are tested on these as well as on real runs."""

from __future__ import annotations

from core.events import KVUsage, RadixNodeView, ReqStep, StepEvent, WaitReason
from render.trace_format import Trace, TraceHeader

LABELS = ("The capital of France is", "List three prime numbers:", "The capital of Spain is", "1 + 1 =")


def _kv(by_request: dict[int, int], cached: int, total: int = 64) -> KVUsage:
    return KVUsage(tuple(sorted(by_request.items())), cached, total - sum(by_request.values()) - cached, total)


def _event(step: int, phase: str, reqs: list[tuple[int, int, int]], kv: KVUsage, t: float, **extra) -> StepEvent:
    steps = tuple(ReqStep(*r) for r in reqs)
    used = kv.total - kv.free
    return StepEvent(step=step, phase=phase, batch_size=len(steps), num_tokens=sum(r.extend_len for r in steps),
                     reqs=steps, kv_pages_used=used, kv_pages_total=kv.total, elapsed_s=0.010 + 0.001 * step,
                     kv_pages_cached=kv.cached, kv=kv, started_s=t, **extra)


def _tree(holders: tuple[int, ...], lock: int) -> tuple[RadixNodeView, ...]:
    return (RadixNodeView(1, None, 4, (504, 3575, 282, 4649), 4, lock, holders),
            RadixNodeView(2, 1, 2, (314, 253), 2, 1 if 0 in holders else 0, tuple(u for u in holders if u == 0)),
            RadixNodeView(3, 1, 2, (9498, 253), 2, 1 if 2 in holders else 0, tuple(u for u in holders if u == 2)))


def sample_events() -> list[StepEvent]:
    rows = WaitReason(2, "rows", "no free table row (--max-running 2)")
    kv_wait = WaitReason(3, "kv_pages", "KV: needs 40 pages, 12 free, 0 evictable", 40, 12, 0)
    fcfs = WaitReason(3, "fcfs", "behind uid2, which did not fit")
    return [
        _event(0, "prefill", [(0, 6, 0), (1, 7, 0)], _kv({0: 6, 1: 7}, 0), 0.100, arrived=(0, 1), waiting=0),
        _event(1, "decode", [(0, 1, 6), (1, 1, 7)], _kv({0: 7, 1: 8}, 0), 0.112, arrived=(2,), waits=(rows,),
               waiting=1),
        _event(2, "decode", [(0, 1, 7), (1, 1, 8)], _kv({0: 8}, 8), 0.125, arrived=(3,), waits=(rows, fcfs),
               waiting=2, finished=(1,), radix=_tree((0,), 1)),
        _event(3, "prefill", [(2, 2, 4)], _kv({0: 8, 2: 2}, 8), 0.139, waits=(kv_wait,), waiting=1,
               radix=_tree((0, 2), 2)),
        _event(4, "decode", [(0, 1, 8), (2, 1, 6)], _kv({0: 9, 2: 3}, 8), 0.152, waits=(kv_wait,), waiting=1,
               finished=(0,), radix=_tree((0, 2), 2)),
        _event(5, "prefill", [(3, 5, 0)], _kv({2: 3, 3: 5}, 6), 0.166, waiting=0, evicted_pages=2,
               radix=_tree((2,), 1)),
        _event(6, "decode", [(2, 1, 7), (3, 1, 5)], _kv({2: 4, 3: 6}, 6), 0.180, finished=(2, 3),
               radix=_tree((), 0)),
    ]


def sample_trace(finished: bool = True) -> Trace:
    header = TraceHeader("random:tiny-qwen3", {"cache": "radix", "max_running": 2, "num_pages": 64}, LABELS)
    results = None
    if finished:
        texts = [" Paris.", " 2, 3", " Madrid", " 2"]
        lengths = [4, 2, 3, 1]
        results = [{"uid": i, "text": t, "token_ids": list(range(10, 10 + n)), "finish_reason": "length",
                    "error": None, "prompt_tokens": 6} for i, (t, n) in enumerate(zip(texts, lengths))]
    return Trace(header, sample_events(), results)
