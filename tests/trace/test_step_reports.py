"""What step events tell a learner: why each queued request waits (one scenario per reason), how the KV pool
is split, and the radix tree with its locks and evictions on a run whose tree is known in advance."""

from __future__ import annotations

from core import LLM, SamplingParams

P3 = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]


def run(llm: LLM, prompts, max_tokens: int = 3):
    events = []
    llm.add_step_callback(events.append)
    out = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    assert all(r["finish_reason"] == "length" for r in out)
    return events


def waits_at(event) -> dict[int, str]:
    return {w.uid: w.kind for w in event.waits}


def test_no_free_row_then_first_come_first_served(model_dirs):
    events = run(LLM(model_dirs["llama"], max_running_req=1), P3)
    assert waits_at(events[0]) == {1: "rows", 2: "fcfs"}
    assert "no free table row" in events[0].waits[0].text and "uid1" in events[0].waits[1].text
    for event in events:  # every queued request has exactly one reason, in every step
        assert len(event.waits) == event.waiting - sum(1 for r in event.reqs if r.uid in waits_at(event))


def test_not_enough_kv_pages_says_what_it_needs_and_what_is_free(model_dirs):
    # reserved for its whole life, each request needs 3 + 6 - 1 = 8 pages of 1 token; the pool has 12, and uid0
    # (admitted first in the same step) was promised 8 of them before any was handed out
    llm = LLM(model_dirs["llama"], num_pages=12, max_running_req=4, admission="reserve")
    events = run(llm, P3[:2], max_tokens=6)
    (wait,) = events[0].waits
    assert (wait.uid, wait.kind, wait.pages_needed, wait.pages_free, wait.pages_evictable) == (1, "kv_pages", 8, 12, 0)
    assert "needs 8 pages, 12 free" in wait.text and "8 promised to running requests" in wait.text
    assert events[-1].reqs[0].uid == 1 and not events[-1].waits  # it ran once uid0 gave its pages back


def test_prefill_token_budget_chunks_and_holds_back(model_dirs):
    llm = LLM(model_dirs["llama"], max_extend_tokens=4, max_running_req=4)
    events = run(llm, P3)
    assert [(r.uid, r.extend_len) for r in events[0].reqs] == [(0, 3), (1, 1)]  # uid1 is cut into chunks
    assert waits_at(events[0]) == {2: "token_budget"}


def test_forced_decode_after_a_prefill_streak(model_dirs):
    llm = LLM(model_dirs["llama"], max_extend_tokens=4, max_running_req=4, max_prefill_streak=1)
    events = run(llm, P3)
    # the streak counts prefill steps taken while others decode: step 1 is one, and what waits then (uid2's last
    # token) is less than a full chunk, so step 2 must decode
    assert [e.phase for e in events[:4]] == ["prefill", "prefill", "decode", "prefill"]
    assert events[2].note and waits_at(events[2]) == {2: "forced_decode"}
    assert "not starved" in events[2].waits[0].text


def test_waiting_for_a_shared_prefix_in_the_same_batch(model_dirs):
    shared = list(range(1, 41))
    events = run(LLM(model_dirs["llama"], cache="radix"), [shared + [50, 51], shared + [60, 61]], max_tokens=2)
    assert waits_at(events[0]) == {1: "shared_prefix"} and "uid0" in events[0].waits[0].text
    assert events[1].reqs[0].cached_len == 40  # and then it reuses what uid0 cached


def test_kv_usage_parts_add_up_to_the_pool(model_dirs):
    llm = LLM(model_dirs["llama"], cache="radix", page_size=2, num_pages=64, max_running_req=2)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 9, 9, 9], [8, 8, 8, 8, 8]]
    for event in run(llm, prompts, max_tokens=4):
        kv = event.kv
        assert kv.total == 64 and kv.cached == event.kv_pages_cached
        assert kv.free + kv.cached + sum(p for _, p in kv.by_request) == kv.total
        assert kv.total - kv.free == event.kv_pages_used
        assert {uid for uid, _ in kv.by_request} >= {r.uid for r in event.reqs}


def test_radix_tree_locks_and_eviction_on_a_known_run(model_dirs):
    # page 2, pool of 10 pages; one request at a time. Prompt A (6 tokens) then B sharing A's first 4 tokens.
    llm = LLM(model_dirs["llama"], cache="radix", page_size=2, num_pages=10, max_running_req=1)
    llm.report_radix = True
    a, b = [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7, 8]
    events = run(llm, [a, b], max_tokens=2)
    first = events[0]  # A prefilled: its 3 full prompt pages are in the tree, locked by uid0
    assert [(n.num_tokens, n.lock_count, n.holders) for n in first.radix] == [(6, 1, (0,))]
    b_prefill = next(e for e in events if e.phase == "prefill" and e.reqs[0].uid == 1)
    assert b_prefill.reqs[0].cached_len == 4
    # B's prefill split A's node after 4 tokens: [1 2 3 4] shared, [5 6] A's only (now free of locks), [7 8] B's
    view = {n.first_tokens: (n.num_tokens, n.lock_count, n.holders) for n in b_prefill.radix}
    assert view == {(1, 2, 3, 4): (4, 1, (1,)), (5, 6): (2, 0, ()), (7, 8): (2, 1, (1,))}
    parents = {n.first_tokens: n.parent_id for n in b_prefill.radix}
    root_child = next(n.node_id for n in b_prefill.radix if n.first_tokens == (1, 2, 3, 4))
    assert parents[(1, 2, 3, 4)] is None and parents[(5, 6)] == parents[(7, 8)] == root_child
    # the tree now holds 4 pages, 6 are free; a request needing 7 (13 + 2 - 1 tokens) evicts exactly one page,
    # the least recently used leaf: A's own branch [5 6]
    c = list(range(20, 33))
    events = run(llm, [c], max_tokens=2)
    assert [e.evicted_pages for e in events] == [1, 0]
    assert {n.first_tokens for n in events[0].radix} == {(1, 2, 3, 4), (7, 8), tuple(c[:8])}
