"""Grammars compile on a worker thread, off the engine loop's: a request whose grammar is not ready waits in the
queue (wait kind "grammar") while the others are admitted past it and keep stepping, then runs to the very tokens
it gets when its grammar was compiled already; a grammar that cannot be built answers its requests with the error;
a request aborted while its grammar compiles is answered, and the compile is kept for the next one."""

from __future__ import annotations

import threading

import pytest

from core import LLM, SamplingParams
from core.constrain.grammars import Grammars
from core.constraint import Constraint
from core.errors import InvalidConstraintError

from tests.support.checks import assert_pages_accounted

MODEL = "llama"
WAIT_S = 60.0  # bound on any wait: a broken loop fails the test instead of hanging it
CODE = Constraint.regex(r"[A-Z]{2}-[0-9]{2,3}")
UNDER = SamplingParams(max_tokens=12, temperature=1.0, seed=3, constraint=CODE)
FREE = SamplingParams(max_tokens=8, temperature=1.0, seed=5, ignore_eos=True)


@pytest.fixture
def llm(model_dirs) -> LLM:
    return LLM(model_dirs[MODEL], max_running_req=4)


class Gate:
    """Compiles held on the worker until ``open()``, counted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> None:
        self.opened, self.compiles = threading.Event(), []
        compile_now = Grammars._compile

        def held(grammars: Grammars, constraint: Constraint):
            self.compiles.append(constraint)
            assert self.opened.wait(WAIT_S), "the gate was never opened"
            return InvalidConstraintError(f"{constraint.describe()} cannot be used: boom") if fail else \
                compile_now(grammars, constraint)

        monkeypatch.setattr(Grammars, "_compile", held)

    def open(self) -> None:
        self.opened.set()


def test_the_loop_steps_others_while_a_grammar_compiles_and_its_tokens_are_unchanged(llm, monkeypatch):
    gate, events = Gate(monkeypatch), []

    def on_step(event) -> None:
        events.append(event)
        if event.step == 3:
            gate.open()

    llm.add_step_callback(on_step)
    under, free = llm.generate(["code:", "free"], [UNDER, FREE])
    first_steps = [tuple(r.uid for r in e.reqs) for e in events[:4]]
    assert first_steps[0] == (1,) and all(uids == (1,) for uids in first_steps)  # the queue went on past uid 0
    assert all([(w.uid, w.kind) for w in e.waits] == [(0, "grammar")] for e in events[:4])
    assert "grammar is being compiled" in events[0].waits[0].text
    assert any(0 in [r.uid for r in e.reqs] for e in events[4:])
    assert gate.compiles == [CODE] and under["finish_reason"] in ("stop", "length")
    # compiled already now: its matcher comes at once, and the tokens are the same
    assert llm.generate(["code:"], [UNDER])[0]["token_ids"] == under["token_ids"]
    assert llm.generate(["free"], [FREE])[0]["token_ids"] == free["token_ids"]
    assert gate.compiles == [CODE]
    assert_pages_accounted(llm)


def test_a_grammar_that_cannot_be_built_answers_each_of_its_requests_with_the_error(llm, monkeypatch):
    gate = Gate(monkeypatch, fail=True)
    gate.open()
    out = llm.generate(["a", "b", "c"], [UNDER, FREE, UNDER])
    for r in (out[0], out[2]):
        assert (r["finish_reason"], r["token_ids"]) == ("error", []) and "cannot be used: boom" in r["error"], r
    assert out[1]["finish_reason"] == "length" and len(out[1]["token_ids"]) == FREE.max_tokens
    assert gate.compiles == [CODE]  # once for both; known now, the next one is answered when it arrives
    again = llm.generate(["d"], [UNDER])[0]
    assert again["finish_reason"] == "error" and "boom" in again["error"] and gate.compiles == [CODE]
    assert_pages_accounted(llm)


def test_a_request_aborted_while_its_grammar_compiles_is_answered_and_the_compile_kept(llm, monkeypatch):
    gate, aborted = Gate(monkeypatch), []

    def on_step(event) -> None:
        if event.step == 0:
            aborted.append(llm.abort(0))
            gate.open()

    llm.add_step_callback(on_step)
    out = llm.generate(["code:", "free"], [UNDER, FREE])
    assert aborted == [True]
    assert (out[0]["finish_reason"], out[0]["token_ids"]) == ("abort", [])
    assert out[1]["finish_reason"] == "length"
    later = llm.generate(["code:"], [UNDER])[0]
    assert later["finish_reason"] in ("stop", "length") and later["token_ids"]
    assert gate.compiles == [CODE]
    assert_pages_accounted(llm)


def test_a_loop_with_only_a_grammar_to_wait_for_waits_until_the_worker_wakes_it(llm, monkeypatch):
    """Nothing else to run: the loop neither leaves (the request would go unanswered) nor gives up on it; the
    worker's message wakes it."""
    gate = Gate(monkeypatch)
    timer = threading.Timer(0.3, gate.open)
    timer.start()
    out = llm.generate(["code:"], [UNDER])[0]
    timer.join()
    assert out["finish_reason"] in ("stop", "length") and out["token_ids"], out
    assert gate.compiles == [CODE]


def test_tensor_parallel_ranks_agree_on_when_a_grammar_is_ready(llm, model_dirs):
    """Each rank compiles on its own worker; rank 0's GrammarReady tells every rank when to admit the request, so
    the ranks form the same batches and the tokens are one rank's."""
    prompts = ["code:", "free", "yes?"]
    params = [UNDER, FREE, SamplingParams(max_tokens=8, temperature=1.0, seed=7,
                                          constraint=Constraint.choice(["yes", "no"]))]
    alone = [r["token_ids"] for r in llm.generate(prompts, params)]
    with LLM(model_dirs[MODEL], tp=2, max_running_req=4) as ranks:
        assert [r["token_ids"] for r in ranks.generate(prompts, params)] == alone
        assert [r["token_ids"] for r in ranks.generate(prompts, params)] == alone  # compiled already, now
