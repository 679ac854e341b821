"""The messages between the engine's process and its clients: each survives the trip as bytes, and turning the
radix tree on and off reaches a real engine process (its step events carry the tree only while asked)."""

from __future__ import annotations

import threading
from pathlib import Path

from core import SamplingParams
from core.scheduler.inbox import AbortRequest, AddRequest, ResetPrefixCache
from serving.wire import ReportRadix, Stop, pack_message, unpack_message


def test_every_message_in_survives_packing():
    params = SamplingParams(max_tokens=3, stop=("x",))
    for message in (AddRequest(7, (1, 2, 3), params), AbortRequest(7), ResetPrefixCache(), ReportRadix(True),
                    ReportRadix(False), Stop()):
        assert unpack_message(pack_message(message)) == message


def test_the_radix_tree_is_in_step_events_only_while_asked(model_dirs):
    from core.config import EngineConfig
    from core.llm.llm import load_tokenizer
    from serving.remote import RemoteEngine

    model_dir = Path(model_dirs["llama"])
    remote = RemoteEngine(EngineConfig.from_options(cache="radix", page_size=2), model_dir,
                          load_tokenizer(model_dir), trace=True)
    events = []
    remote.add_step_callback(events.append)
    remote.start()
    try:
        def run(prompt: list[int]) -> list:
            """The step events that ran this request (one request at a time: they are its own steps)."""
            done = threading.Event()
            uid = remote.submit(prompt, SamplingParams(max_tokens=3, ignore_eos=True),
                                on_reply=lambda reply: reply.finished and done.set())
            assert done.wait(60)
            return [e for e in list(events) if any(r.uid == uid for r in e.reqs)]

        assert all(e.radix is None for e in run([5, 6, 7, 8, 9]))
        remote.report_radix(True)
        mine = run([5, 6, 7, 8, 10])
        assert mine and all(e.radix is not None for e in mine) and any(e.radix for e in mine)
        remote.report_radix(False)
        assert all(e.radix is None for e in run([5, 6, 7, 8, 11]))
    finally:
        remote.stop()
