"""Mixed steps (``mixed_steps``, off by default): requests that decode ride in a prefill step, one token
each, instead of waiting for a decode step of their own. Seen through the whole engine on a CPU: greedy tokens are
transformers', seeded samples those of alternating steps, under both loops, with prompts cut into chunks and
shared through the prefix cache; after every run every KV page is accounted for."""

from __future__ import annotations

import random

import pytest

from core import LLM, SamplingParams
from render.timeline import request_states
from render.trace_format import Trace, TraceHeader, parse_trace, trace_lines
from tests.support.checks import assert_pages_accounted, greedy

MODEL = "llama"
BUDGET = 16  # prefill tokens a step: the longer prompts are cut into chunks


def workload() -> tuple[list[list[int]], list[int]]:
    """Prompts of 3 to 40 tokens, some sharing a 12-token prefix, and outputs long enough to overlap prefills."""
    rng = random.Random(5)
    shared = [rng.randrange(256) for _ in range(12)]
    prompts = [[rng.randrange(256) for _ in range(rng.randint(3, 40))] for _ in range(6)]
    prompts += [shared + [rng.randrange(256) for _ in range(k)] for k in (2, 7, 19)]
    return prompts, [rng.randint(4, 14) for _ in prompts]


def run(path: str, mixed: bool, overlap: bool, params: list[SamplingParams]) -> tuple[list[dict], list, LLM]:
    llm = LLM(path, mixed_steps=mixed, overlap=overlap, max_running_req=4, page_size=4, max_extend_tokens=BUDGET)
    events: list = []
    llm.add_step_callback(events.append)
    out = llm.generate(workload()[0], params)
    assert_pages_accounted(llm)
    return out, events, llm


def riders(events: list, prompts: list[list[int]]) -> list:
    """The rows of prefill steps that were decoding requests: past their whole prompt (uids count up from the
    first one seen, in the prompts' order)."""
    first = min(s.uid for e in events for s in e.reqs)
    return [s for e in events if e.phase == "prefill" for s in e.reqs if s.cached_len >= len(prompts[s.uid - first])]


@pytest.mark.parametrize("overlap", [False, True])
def test_mixed_steps_give_transformers_greedy_tokens(model_dirs, overlap):
    path = model_dirs[MODEL]
    prompts, max_tokens = workload()
    out, events, llm = run(path, True, overlap, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens])
    assert [r["token_ids"] for r in out] == [greedy(path, p, n) for p, n in zip(prompts, max_tokens)]
    rode = riders(events, prompts)
    assert rode and all(s.extend_len == 1 for s in rode)  # decoding requests rode in prefill steps, a token each
    for e in (e for e in events if e.phase == "prefill"):  # the prompts' tokens keep to the budget; riders add one
        assert sum(s.extend_len for s in e.reqs if s not in rode) <= BUDGET
    assert not any(e.note for e in events)  # no decode step is ever forced: nobody waits for one
    assert llm.stats()["hit_rate"] > 0  # the shared prefix was found in the cache


@pytest.mark.parametrize("overlap", [False, True])
def test_mixed_steps_sample_what_alternating_steps_sample(model_dirs, overlap):
    path = model_dirs[MODEL]
    params = [SamplingParams(max_tokens=n, temperature=0.9, top_k=20, seed=i, ignore_eos=True)
              for i, n in enumerate(workload()[1])]
    mixed, mixed_events, _ = run(path, True, overlap, params)
    alternating, alternating_events, _ = run(path, False, overlap, params)
    assert [r["token_ids"] for r in mixed] == [r["token_ids"] for r in alternating]
    assert riders(mixed_events, workload()[0]) and not riders(alternating_events, workload()[0])
    assert len(mixed_events) < len(alternating_events)  # the same work in fewer steps


def test_riders_are_marked_decoding_in_the_steps_and_the_views(model_dirs):
    prompts, max_tokens = workload()
    _, events, _ = run(model_dirs[MODEL], True, True, [SamplingParams(max_tokens=n, ignore_eos=True)
                                                      for n in max_tokens])
    marked = [s for e in events for s in e.reqs if s.decoding]
    assert marked == riders(events, prompts)  # the event says which rows ride, as their lengths do
    uids = sorted({s.uid for e in events for s in e.reqs})
    for uid, states in request_states(events, uids).items():  # prefill chunks, then decoding only
        assert "P" not in states[states.index("D"):], (uid, states)
    header = TraceHeader("llama", {"mixed_steps": True}, tuple(f"p{i}" for i in range(len(prompts))))
    back = parse_trace(trace_lines(Trace(header, events, None)))
    assert back.events == events  # a trace file keeps the mark
