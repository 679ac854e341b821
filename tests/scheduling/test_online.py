"""Online submission: requests posted from another thread while the loop runs, arrivals joining a running batch,
aborts from outside the loop, a graceful stop, and the same path on tensor-parallel ranks."""

from __future__ import annotations

import threading
import time

import pytest

from core.errors import ContextLengthError

from tests.support.checks import assert_pages_accounted, greedy
from core import LLM, EngineBusyError, SamplingParams

PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12, 13, 14], [15, 16, 17], [18, 19, 20, 21, 22, 23]]
WAIT_S = 60.0  # bound on any wait: a broken loop fails the test instead of hanging it


@pytest.fixture
def llm(model_dirs) -> LLM:
    return LLM(model_dirs["llama"], max_running_req=4, page_size=2)


class Collector:
    """Tokens and the final reply of every request, as the per-request callbacks deliver them."""

    def __init__(self) -> None:
        self.tokens: dict[int, list[int]] = {}
        self.final: dict[int, str] = {}
        self.after_final: list[int] = []
        self.all_done = threading.Event()
        self.expected = 0

    def on_reply(self, reply) -> None:
        if reply.uid in self.final:
            self.after_final.append(reply.uid)
        if reply.token is not None:
            self.tokens.setdefault(reply.uid, []).append(reply.token)
        if reply.finished:
            self.final[reply.uid] = reply.finish_reason
            if len(self.final) == self.expected:
                self.all_done.set()


def serve_in_thread(llm: LLM) -> threading.Thread:
    """``serve_forever`` on a new thread, returned once that thread owns the loop (else a call made right after
    could take the loop first and leave the thread to fail with EngineBusyError)."""
    thread = threading.Thread(target=llm.serve_forever, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while not llm.loop_running_elsewhere:
        assert thread.is_alive() and time.monotonic() < deadline, "the serving thread never took the loop"
        time.sleep(0.001)
    return thread


def test_requests_submitted_from_another_thread_match_generate(llm, model_dirs):
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    collector = Collector()
    collector.expected = len(PROMPTS)
    loop = serve_in_thread(llm)
    uids = []
    for prompt in PROMPTS:  # staggered: some arrive while others decode
        uids.append(llm.submit(prompt, params, on_reply=collector.on_reply))
        time.sleep(0.05)
    assert collector.all_done.wait(WAIT_S)
    llm.stop()
    loop.join(WAIT_S)
    assert not loop.is_alive()
    assert [collector.final[u] for u in uids] == ["length"] * len(PROMPTS)
    assert [collector.tokens[u] for u in uids] == [greedy(model_dirs["llama"], p, 5) for p in PROMPTS]
    assert collector.after_final == []
    offline = llm.generate(PROMPTS, params)
    assert [r["token_ids"] for r in offline] == [collector.tokens[u] for u in uids]
    assert_pages_accounted(llm)


def test_a_request_arriving_mid_decode_is_prefilled_next_while_the_others_decode(llm, model_dirs):
    events = []
    llm.add_step_callback(events.append)
    late: list[int] = []

    def arrive(step: int) -> None:
        if step == 3 and not late:
            late.append(llm.submit(PROMPTS[3], SamplingParams(max_tokens=3, ignore_eos=True)))

    llm.add_before_step_callback(arrive)
    out = llm.generate(PROMPTS[:2], SamplingParams(max_tokens=8, ignore_eos=True))
    phases = [(e.phase, tuple(r.uid for r in e.reqs)) for e in events]
    assert phases[:3] == [("prefill", (0, 1)), ("decode", (0, 1)), ("decode", (0, 1))]
    assert phases[3] == ("prefill", (late[0],))  # prefill first: it does not wait for the others to finish
    assert events[3].arrived == (late[0],) and all(e.arrived == () for e in events[1:3])
    # and then it decodes in the same batch as they do (rows shortest sequence first, core/scheduler/decode.py)
    assert phases[4][0] == "decode" and sorted(phases[4][1]) == [0, 1, late[0]]
    rows = [(r.cached_len + r.extend_len, r.uid) for r in events[4].reqs]
    assert rows == sorted(rows)
    assert [r["token_ids"] for r in out] == [greedy(model_dirs["llama"], p, 8) for p in PROMPTS[:2]]


def test_abort_from_another_thread_while_the_loop_runs(llm, model_dirs):
    collector = Collector()
    collector.expected = 2
    loop = serve_in_thread(llm)
    first_token = threading.Event()

    def on_reply(reply) -> None:
        collector.on_reply(reply)
        if reply.token is not None:
            first_token.set()

    long_one = llm.submit(PROMPTS[0], SamplingParams(max_tokens=200, ignore_eos=True), on_reply=on_reply)
    short_one = llm.submit(PROMPTS[1], SamplingParams(max_tokens=3, ignore_eos=True), on_reply=collector.on_reply)
    assert first_token.wait(WAIT_S)
    assert llm.abort(long_one) is True
    assert llm.abort(long_one) is False  # answered already
    assert collector.all_done.wait(WAIT_S)
    llm.stop()
    loop.join(WAIT_S)
    assert collector.final == {long_one: "abort", short_one: "length"}
    assert 1 <= len(collector.tokens[long_one]) < 200
    assert collector.tokens[long_one] == greedy(model_dirs["llama"], PROMPTS[0], len(collector.tokens[long_one]))
    assert collector.after_final == []
    assert_pages_accounted(llm)


def test_stop_answers_every_submitted_request_before_the_loop_returns(llm):
    collector = Collector()
    collector.expected = len(PROMPTS)
    loop = serve_in_thread(llm)
    for prompt in PROMPTS:
        llm.submit(prompt, SamplingParams(max_tokens=6, ignore_eos=True), on_reply=collector.on_reply)
    llm.stop()
    loop.join(WAIT_S)
    assert not loop.is_alive()
    assert sorted(collector.final.values()) == ["length"] * len(PROMPTS)
    assert llm.unanswered == 0
    assert_pages_accounted(llm)


def test_generate_joins_a_loop_running_on_another_thread(llm, model_dirs):
    loop = serve_in_thread(llm)
    try:
        out = llm.generate(PROMPTS[:3], SamplingParams(max_tokens=4, ignore_eos=True))
        with pytest.raises(EngineBusyError):
            llm.run_until_idle()
    finally:
        llm.stop()
        loop.join(WAIT_S)
    assert [r["token_ids"] for r in out] == [greedy(model_dirs["llama"], p, 4) for p in PROMPTS[:3]]


def test_a_rejected_request_is_answered_with_its_reason(llm):
    collector = Collector()
    collector.expected = 1
    too_long = list(range(1, 20)) * 1000
    reason = llm.rejection(too_long, SamplingParams(max_tokens=4))
    assert isinstance(reason, ContextLengthError) and "exceeds the context" in str(reason)
    errors = []
    llm.submit(too_long, SamplingParams(max_tokens=4), on_reply=lambda r: errors.append((r.finish_reason, r.error)))
    llm.run_until_idle()
    assert errors == [("error", str(reason))]


def test_tensor_parallel_ranks_take_online_requests_and_aborts(model_dirs):
    path = model_dirs["llama"]
    with LLM(path, tp=2, max_running_req=4, page_size=2) as llm:
        aborted = []

        def on_step(event) -> None:  # abort uid 1 once it has decoded: every rank must drop it at once
            if event.phase == "decode" and not aborted:
                aborted.append(llm.abort(1))

        llm.add_step_callback(on_step)
        out = llm.generate(PROMPTS[:3], SamplingParams(max_tokens=6, ignore_eos=True))
        assert aborted == [True] and out[1]["finish_reason"] == "abort"
        assert [out[i]["token_ids"] for i in (0, 2)] == [greedy(path, PROMPTS[i], 6) for i in (0, 2)]
        llm.scheduler.step_callbacks.clear()
        again = llm.generate(PROMPTS[3:], SamplingParams(max_tokens=3, ignore_eos=True))  # the ranks still agree
        assert [r["token_ids"] for r in again] == [greedy(path, p, 3) for p in PROMPTS[3:]]
