"""The messages between the engine's process and its clients, as bytes (msgpack; token ids as int64 arrays).

In, from a client: a request (uid, prompt ids, sampling parameters), an abort, a prefix-cache reset, whether
step events carry the radix tree (only while someone draws it: building it costs a walk of the tree each step),
or stop (answer everything taken in, then leave). Out, from the engine: a log line while it loads, ready (what a client
needs to check requests itself: the limits, the EOS ids), one message per step with every request's new token,
the finished ones' reasons and the logprobs asked for, the engine's numbers for /metrics, and the step event when
a trace is on; or fatal, when the engine cannot go on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from core.events import StepEvent
from core.constraint import Constraint
from core.request import SamplingParams
from core.scheduler.inbox import AbortRequest, AddRequest, Message, ResetPrefixCache
from core.scheduler.reply import Reply

NO_TOKEN = -1  # a reply without a token (an abort, an error)


@dataclass(frozen=True)
class Stop:
    """Answer every request already taken in, then leave the loop and exit."""


@dataclass(frozen=True)
class ReportRadix:
    """Turn the radix tree in step events on or off (a dashboard asks for it while a viewer shows it)."""

    on: bool


@dataclass(frozen=True)
class EngineInfo:
    """What the engine tells its clients once it is built."""

    vocab_size: int
    max_seq_len: int
    page_size: int
    num_pages: int
    eos_token_ids: tuple[int, ...]
    description: str
    precision_note: str
    pid: int
    worker_pids: tuple[int, ...]


@dataclass
class StepOutput:
    """One message from the engine: replies, the engine's numbers, a step event, a log line or a fatal error."""

    replies: list[Reply]
    stats: dict[str, Any] | None = None
    event: StepEvent | None = None
    log: str | None = None
    info: EngineInfo | None = None
    fatal: tuple[str, str] | None = None  # (error type name, message)


# ---- in ---------------------------------------------------------------------------------------------------------
def pack_message(message: Message | Stop | ReportRadix) -> bytes:
    if isinstance(message, AddRequest):
        params = dataclasses.asdict(message.params)
        ids = np.asarray(message.input_ids, dtype=np.int64).tobytes()
        return msgpack.packb(["add", message.uid, ids, params])
    if isinstance(message, AbortRequest):
        return msgpack.packb(["abort", message.uid])
    if isinstance(message, ResetPrefixCache):
        return msgpack.packb(["reset"])
    if isinstance(message, ReportRadix):
        return msgpack.packb(["radix", message.on])
    return msgpack.packb(["stop"])


def unpack_message(data: bytes) -> Message | Stop | ReportRadix:
    kind, *rest = msgpack.unpackb(data)
    if kind == "add":
        uid, ids, params = rest
        params["stop"] = tuple(params["stop"])
        if params.get("constraint") is not None:
            params["constraint"] = Constraint.unpack(params["constraint"])
        return AddRequest(uid, tuple(np.frombuffer(ids, dtype=np.int64).tolist()), SamplingParams(**params))
    if kind == "abort":
        return AbortRequest(rest[0])
    if kind == "reset":
        return ResetPrefixCache()
    if kind == "radix":
        return ReportRadix(bool(rest[0]))
    return Stop()


# ---- out --------------------------------------------------------------------------------------------------------
def pack_output(out: StepOutput) -> bytes:
    replies = out.replies
    uids = np.fromiter((r.uid for r in replies), dtype=np.int64, count=len(replies)).tobytes()
    tokens = np.fromiter((NO_TOKEN if r.token is None else r.token for r in replies), dtype=np.int64,
                         count=len(replies)).tobytes()
    ends = [[i, r.finish_reason, r.error] for i, r in enumerate(replies) if r.finished]
    logprobs = [[i, r.logprob, r.top_logprobs] for i, r in enumerate(replies) if r.logprob is not None]
    return msgpack.packb({
        "u": uids, "t": tokens, "e": ends, "l": logprobs, "s": out.stats,
        "v": out.event.to_dict() if out.event is not None else None, "g": out.log,
        "i": dataclasses.asdict(out.info) if out.info is not None else None, "f": out.fatal})


def unpack_output(data: bytes) -> StepOutput:
    m = msgpack.unpackb(data)
    uids = np.frombuffer(m["u"], dtype=np.int64).tolist()
    tokens = np.frombuffer(m["t"], dtype=np.int64).tolist()
    replies = [Reply(uid, None if token == NO_TOKEN else token, False) for uid, token in zip(uids, tokens)]
    for i, reason, error in m["e"]:
        replies[i].finished, replies[i].finish_reason, replies[i].error = True, reason, error
    for i, logprob, top in m["l"]:
        replies[i].logprob = logprob
        replies[i].top_logprobs = tuple((int(t), float(lp)) for t, lp in top) if top is not None else None
    info = m["i"]
    if info is not None:
        info = EngineInfo(**{**info, "eos_token_ids": tuple(info["eos_token_ids"]),
                             "worker_pids": tuple(info["worker_pids"])})
    return StepOutput(replies, m["s"], StepEvent.from_dict(m["v"]) if m["v"] is not None else None, m["g"], info,
                      tuple(m["f"]) if m["f"] is not None else None)
