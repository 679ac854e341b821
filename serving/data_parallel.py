"""Several engine processes behind one API front: ``minisgl serve --dp N``.

Each engine is a whole model with its own KV cache and prefix cache (serving/remote.py). A request goes to the
engine whose prefix cache most likely holds the longest part of its prompt, else to the least loaded one. The
front cannot see the engines' radix trees, so it remembers what it sent: per engine, the prompts' prefixes at
every ``BLOCK`` tokens (hashed), the newest ``REMEMBERED`` of them. A prefix it sent an engine recently is most
likely still cached there; a wrong guess costs only a prefill, never a wrong token.

Uids are disjoint (engine i gives i, i + N, ...), so an abort finds its engine by ``uid % N``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Sequence

from core.errors import RequestRejected
from core.events import StepEvent
from serving.remote import RemoteEngine
from core.llm.routes import ReplyCallback
from core.generation import SamplingDefaults
from core.request import SamplingParams

BLOCK = 16  # tokens per remembered prefix step
REMEMBERED = 65536  # prefixes remembered per engine (oldest forgotten first)


class PrefixMemory:
    """Which prompt prefixes were sent to one engine, newest last."""

    def __init__(self, capacity: int = REMEMBERED) -> None:
        self._seen: OrderedDict[int, None] = OrderedDict()
        self._capacity = capacity

    def matched(self, keys: Sequence[int]) -> int:
        """How many leading blocks of a prompt (its prefix keys, shortest first) this engine was sent."""
        n = 0
        for key in keys:
            if key not in self._seen:
                break
            n += 1
        return n

    def remember(self, keys: Sequence[int]) -> None:
        for key in keys:
            self._seen[key] = None
            self._seen.move_to_end(key)
        while len(self._seen) > self._capacity:
            self._seen.popitem(last=False)


def prefix_keys(input_ids: Sequence[int]) -> list[int]:
    """A hash of every whole-block prefix of the prompt, shortest first."""
    return [hash(tuple(input_ids[:end])) for end in range(BLOCK, len(input_ids) + 1, BLOCK)]


def pick_engine(keys: Sequence[int], memories: Sequence[PrefixMemory], loads: Sequence[tuple[int, int]]) -> int:
    """The engine with the longest remembered prefix; among equals (no match at all included), the least
    loaded (requests open, then requests sent so far), then the lowest index."""
    matched = [memory.matched(keys) for memory in memories]
    return min(range(len(memories)), key=lambda i: (-matched[i], loads[i], i))


class DataParallelEngines:
    """N RemoteEngines seen as one: what the server's bridge asks of an engine, routed."""

    def __init__(self, engines: list[RemoteEngine]) -> None:
        self.engines = engines
        self._memories = [PrefixMemory() for _ in engines]
        self.placed = [0] * len(engines)  # requests sent to each engine so far

    # ---- start and stop ------------------------------------------------------------------------------------
    def start(self, log: Callable[[str], None] | None = None,
              while_loading: Callable[[], None] | None = None) -> None:
        for i, engine in enumerate(self.engines):
            engine.start(log=(lambda text, i=i: log(f"engine {i}: {text}")) if log is not None else None,
                         while_loading=while_loading if i == 0 else None)

    @property
    def tokenizer(self) -> Any:
        return self.engines[0].tokenizer

    def give_tokenizer(self, tokenizer: Any) -> None:
        for engine in self.engines:
            engine.give_tokenizer(tokenizer)

    def stop(self) -> None:
        for engine in self.engines:
            engine.stop()

    def close(self) -> None:
        for engine in self.engines:
            engine.close()

    # ---- what the server asks --------------------------------------------------------------------------------
    @property
    def dead(self) -> str | None:
        return next((engine.dead for engine in self.engines if engine.dead is not None), None)

    @property
    def pid(self) -> int | None:
        return self.engines[0].pid

    @property
    def pids(self) -> list[int | None]:
        return [engine.pid for engine in self.engines]

    @property
    def worker_pids(self) -> list[list[int]]:
        return [pids for engine in self.engines for pids in engine.worker_pids]

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.engines[0].eos_token_ids

    @property
    def sampling_defaults(self) -> SamplingDefaults:
        return self.engines[0].sampling_defaults

    @property
    def max_seq_len(self) -> int:
        return self.engines[0].max_seq_len

    @property
    def capacity_tokens(self) -> int:
        return min(engine.capacity_tokens for engine in self.engines)

    @property
    def unanswered(self) -> int:
        return sum(engine.unanswered for engine in self.engines)

    def stats(self) -> dict[str, Any]:
        """The engines' numbers added up; the hit rate over all their prompt tokens."""
        total: dict[str, Any] = {}
        for engine in self.engines:
            for key, value in engine.stats().items():
                total[key] = total.get(key, 0) + value
        prompt = total.get("prompt_tokens", 0)
        total["hit_rate"] = total.get("cached_prompt_tokens", 0) / prompt if prompt else 0.0
        return total

    def rejection(self, input_ids: list[int], params: SamplingParams) -> RequestRejected | None:
        return self.engines[0].rejection(input_ids, params)

    def tokenize(self, prompt: Any) -> list[int]:
        return self.engines[0].tokenize(prompt)

    def submit(self, input_ids: list[int], params: SamplingParams, *, on_reply: ReplyCallback | None = None,
               text: bool = False) -> int:
        keys = prefix_keys(input_ids)
        i = pick_engine(keys, self._memories, [(e.unanswered, n) for e, n in zip(self.engines, self.placed)])
        self._memories[i].remember(keys)
        self.placed[i] += 1
        return self.engines[i].submit(input_ids, params, on_reply=on_reply, text=text)

    def abort(self, uid: int) -> bool:
        return self.engines[uid % len(self.engines)].abort(uid)

    def abort_all(self) -> int:
        return sum(engine.abort_all() for engine in self.engines)

    def add_step_callback(self, fn: Callable[[StepEvent], None]) -> None:
        for engine in self.engines:
            engine.add_step_callback(fn)

    def report_radix(self, on: bool) -> None:
        for engine in self.engines:
            engine.report_radix(on)

    @property
    def on_batch(self) -> Callable[[], None] | None:
        return self.engines[0].on_batch

    @on_batch.setter
    def on_batch(self, fn: Callable[[], None] | None) -> None:
        for engine in self.engines:
            engine.on_batch = fn

    @property
    def on_death(self) -> Callable[[str], None] | None:
        return self.engines[0].on_death

    @on_death.setter
    def on_death(self, fn: Callable[[str], None] | None) -> None:
        for engine in self.engines:
            engine.on_death = fn
