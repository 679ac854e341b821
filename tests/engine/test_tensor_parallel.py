"""Tensor parallelism on the CPU (gloo): the same tokens on 1, 2 or 4 ranks, and no hang or orphan when a
worker dies or the caller stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from core import LLM, InvalidParamsError, SamplingParams, WorkerError
from tests.support.models import save_random_model
from tests.support.reference import hf_greedy
from tests.support.prompts import varied_prompts


@pytest.fixture(scope="module")
def odd_vocab_tied_llama(tmp_path_factory) -> str:
    """321 tokens (the last of 4 vocab shards is padded) and an LM head tied to the sharded embedding."""
    return str(save_random_model(tmp_path_factory.mktemp("tp") / "llama", "llama", seed=2, vocab_size=321,
                                 tie_word_embeddings=True))


def _run(llm: LLM, prompts, params) -> tuple[list[list[int]], list[tuple[str, tuple[int, ...], tuple[int, ...]]]]:
    events = []
    llm.add_step_callback(events.append)
    out = llm.generate(prompts, params)
    assert all(r["finish_reason"] == "length" for r in out)
    first = out[0]["uid"]  # uids counted from this call's first, whatever ran on the LLM before
    return [r["token_ids"] for r in out], [(e.phase, tuple(s.uid - first for s in e.reqs),
                                            tuple(uid - first for uid in e.preempted)) for e in events]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _check_against_one_rank_and_transformers(llm: LLM, path: str, tp: int, prompts=None, max_tokens=None,
                                              **options) -> list:
    """The same tokens as one rank (with the same ``options``) and transformers, and the same batches and
    preemptions; returns the batches."""
    if prompts is None:
        prompts, max_tokens = varied_prompts(5, seed=tp)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens]
    single_tokens, single_batches = _run(LLM(path, max_running_req=3, page_size=4, **options), prompts, params)
    events = []
    llm.add_step_callback(events.append)
    tokens, batches = _run(llm, prompts, params)
    assert tokens == single_tokens
    assert tokens == [hf_greedy(path, p, n) for p, n in zip(prompts, max_tokens)]
    assert batches == single_batches  # every rank made the decisions one rank makes
    assert {e.tp_size for e in events} == {tp}
    return batches


class TestTwoRanks:
    """Tests that leave the workers healthy share one LLM: starting ranks is the slow part on a small CPU.

    (One tensor-parallel LLM per process at a time: the class scope closes it before the next test starts one.)
    """

    @pytest.fixture(scope="class")
    def qwen3_tp2(self, model_dirs):
        with LLM(model_dirs["qwen3"], tp=2, max_running_req=3, page_size=4, num_pages=16) as llm:
            yield llm

    def test_two_ranks_one_kv_head_each(self, qwen3_tp2, model_dirs):
        """Qwen3, 4 heads and 2 KV heads: each rank holds 2 query heads and their KV head."""
        _check_against_one_rank_and_transformers(qwen3_tp2, model_dirs["qwen3"], 2, num_pages=16)

    def test_every_rank_preempts_the_same_requests(self, qwen3_tp2, model_dirs):
        """Three requests of 7 pages each in a pool of 16: every rank preempts and recomputes as one rank does,
        each from its own state, and the tokens are transformers'."""
        prompts = [[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8], [9, 7, 9, 3, 2, 3]]
        batches = _check_against_one_rank_and_transformers(qwen3_tp2, model_dirs["qwen3"], 2, prompts, [20] * 3,
                                                           num_pages=16)
        assert any(preempted for _, _, preempted in batches)

    def test_sampling_agrees_with_one_rank_and_repeats(self, qwen3_tp2, model_dirs):
        """Seeded sampling gives one rank's tokens; unseeded requests get seeds from rank 0 and still finish."""
        llm = qwen3_tp2
        prompts = [[3, 1, 4], [1, 5, 9, 2, 6], [5, 3]]
        seeded = [SamplingParams(max_tokens=6, temperature=0.8, top_k=50, seed=s, ignore_eos=True) for s in (1, 2, 3)]
        single = [r["token_ids"] for r in LLM(model_dirs["qwen3"]).generate(prompts, seeded)]
        assert [r["token_ids"] for r in llm.generate(prompts, seeded)] == single
        unseeded = llm.generate(prompts, SamplingParams(max_tokens=5, temperature=1.0, ignore_eos=True))
        assert [len(r["token_ids"]) for r in unseeded] == [5, 5, 5]
        assert [r["token_ids"] for r in llm.generate(prompts, seeded)] == single
        # emptied on every rank: were the workers' caches left full, their batches would differ from rank 0's
        assert llm.reset_prefix_cache() > 0
        assert [r["token_ids"] for r in llm.generate(prompts, seeded)] == single
        stats = llm.stats()
        assert stats["free_pages"] + stats["cached_pages"] == stats["total_pages"]  # every page came back


def test_four_ranks_replicated_kv_heads_padded_tied_vocab(odd_vocab_tied_llama):
    """Llama, 4 heads and 2 KV heads over 4 ranks: each KV head lives on two ranks; 321 tokens leave the last
    vocab shard padded, and the LM head shares the sharded embedding."""
    with LLM(odd_vocab_tied_llama, tp=4, max_running_req=3, page_size=4) as llm:
        _check_against_one_rank_and_transformers(llm, odd_vocab_tied_llama, 4)


def test_two_ranks_slice_qkv_biases(model_dirs):
    with LLM(model_dirs["qwen2"], tp=2, max_running_req=3, page_size=4) as llm:
        _check_against_one_rank_and_transformers(llm, model_dirs["qwen2"], 2)


def test_killed_worker_raises_worker_error_and_leaves_no_process(model_dirs, monkeypatch):
    monkeypatch.setenv("MINISGL_TP_TIMEOUT", "30")  # a bound in case the death went unnoticed
    llm = LLM(model_dirs["qwen3"], tp=2)
    pids = llm.core.pids

    def kill_worker(event):
        if event.step == 2:
            os.kill(pids[0], signal.SIGKILL)

    llm.add_step_callback(kill_worker)
    with pytest.raises(WorkerError, match="worker rank 1 was killed by signal 9"):
        llm.generate([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=40, ignore_eos=True))
    assert all(_gone(pid) for pid in pids)
    with pytest.raises(WorkerError, match="create a new LLM"):
        llm.generate([[1, 2, 3]])


def test_worker_dead_between_calls_is_reported_on_the_next_call(model_dirs):
    llm = LLM(model_dirs["llama"], tp=2)
    assert llm.generate([[7, 8]], SamplingParams(max_tokens=2))[0]["finish_reason"] in ("length", "stop")
    os.kill(llm.core.pids[0], signal.SIGKILL)
    with pytest.raises(WorkerError, match="rank 1 was killed"):
        llm.generate([[7, 8]], SamplingParams(max_tokens=2))


def test_interrupt_in_the_caller_stops_the_workers(model_dirs):
    """Ctrl-C lands in rank 0 (workers ignore it): it propagates as is and the workers are stopped."""
    llm = LLM(model_dirs["qwen3"], tp=2)
    pids = llm.core.pids

    def interrupt(event):
        if event.step == 1:
            raise KeyboardInterrupt

    llm.add_step_callback(interrupt)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=10, ignore_eos=True))
    assert all(_gone(pid) for pid in pids)
    with pytest.raises(WorkerError):
        llm.generate([[1, 2, 3]])


def test_caller_exiting_without_close_leaves_no_worker(model_dirs, tmp_path):
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path[:0] = {[str(Path(__file__).resolve().parents[2])]!r}
        from core import LLM, SamplingParams

        if __name__ == "__main__":
            llm = LLM({model_dirs["qwen3"]!r}, tp=2)
            print(*llm.core.pids, flush=True)
            llm.generate([[1, 2]], SamplingParams(max_tokens=2))
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert pids and all(_gone(pid) for pid in pids)


def test_tp_size_that_does_not_divide_the_heads_is_refused_before_starting(model_dirs):
    with pytest.raises(InvalidParamsError, match="4 attention heads cannot be split over 3 ranks"):
        LLM(model_dirs["qwen3"], tp=3)
