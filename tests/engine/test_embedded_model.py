"""The embedded SmolLM2-135M: the tutorial chapter's five prompts, token-exact, with the chapter's schedule."""

from __future__ import annotations

import pytest
import torch

from core import LLM, SamplingParams
from tests.support.reference import hf_greedy

CHAPTER_PROMPTS = ["The capital of France is", "List three prime numbers:", "def fibonacci(n):", "1 + 1 =",
                   "Once upon a time,"]
CHAPTER_MAX_TOKENS = [6, 2, 5, 1, 4]


@pytest.fixture(scope="module")
def smollm2(smollm2_dir) -> LLM:
    return LLM(max_running_req=8)


def test_chapter_prompts_match_transformers(smollm2, smollm2_dir):
    events = []
    smollm2.add_step_callback(events.append)
    out = smollm2.generate(CHAPTER_PROMPTS, [SamplingParams(max_tokens=n, ignore_eos=True)
                                             for n in CHAPTER_MAX_TOKENS])
    for prompt, n, result in zip(CHAPTER_PROMPTS, CHAPTER_MAX_TOKENS, out):
        ids = smollm2.tokenize(prompt)
        assert result["token_ids"] == hf_greedy(smollm2_dir, ids, n), prompt
        assert len(result["token_ids"]) == n
    assert "Paris" in out[0]["text"]
    # the chapter's pattern: one prefill of all five, then decode batches that shrink as requests finish
    assert [e.phase for e in events] == ["prefill"] + ["decode"] * 5
    assert events[0].batch_size == 5
    assert [e.batch_size for e in events[1:]] == [4, 3, 3, 2, 1]
    # a decode batch's rows: shortest sequence first, then by uid (core/scheduler/decode.py)
    rows = [(r.cached_len + r.extend_len, r.uid) for r in events[1].reqs]
    assert rows == sorted(rows) and len({n for n, _ in rows}) > 1
    assert 3 not in {r.uid for e in events[1:] for r in e.reqs}  # max_tokens=1: done right after prefill


def test_embedded_model_is_the_default(smollm2):
    assert smollm2.engine.model_config.num_layers == 30
    assert smollm2.engine.model_config.num_kv_heads == 3
    assert smollm2.engine.model_config.vocab_size == 49152


def test_the_linears_run_on_their_four_bit_codes_with_the_float32_weights_results(smollm2, monkeypatch):
    """The GGUF's Q4_1 linears, dequantised to float32, are read as their codes by the C GEMM and by the C decode
    step: every one of the 120 (30 layers' QKV, o_proj, gate_up, down), with the same log-probabilities, bit for
    bit, as on the float32 weights (batches of five rows down to one: both kernels)."""
    from core.kernels.cpu.decode import FourBitRows
    from core.kernels.cpu.gemm import four_bit_panels

    if not smollm2.engine.plan.kernels.c_gemm or smollm2.engine.cpu_paths.decode_step is None:
        pytest.skip("the C GEMM or the C decode step does not run here")
    assert four_bit_panels(smollm2.engine.model) == 120
    assert "120 of them as the 4-bit codes" in smollm2.engine.describe()
    step = smollm2.engine.cpu_paths.decode_step
    assert all(isinstance(getattr(layer, name), FourBitRows) for layer in step.layers_kept
               for name in ("qkv", "o_proj", "gate_up", "down"))
    monkeypatch.setenv("MINISGL_DISABLE_FOUR_BIT_WEIGHTS", "1")
    plain = LLM(max_running_req=8)
    assert four_bit_panels(plain.engine.model) == 0
    assert not isinstance(plain.engine.cpu_paths.decode_step.layers_kept[0].qkv, FourBitRows)
    # the bench's floor counts the bytes each reads: three quarters of a byte a weight against four
    from core.bench.runner import _body_bytes

    assert (_body_bytes(smollm2), _body_bytes(plain)) == (0.75, 4)
    assert (_body_bytes(smollm2, one_request=True), _body_bytes(plain, one_request=True)) == (0.75, 4)
    params = [SamplingParams(max_tokens=n + 3, ignore_eos=True, logprobs=0) for n in CHAPTER_MAX_TOKENS]
    got, want = smollm2.generate(CHAPTER_PROMPTS, params), plain.generate(CHAPTER_PROMPTS, params)
    assert [r["token_ids"] for r in got] == [r["token_ids"] for r in want]
    assert [r["logprobs"] for r in got] == [r["logprobs"] for r in want]


def test_repetition_penalty_matches_transformers_generate(smollm2, smollm2_dir):
    """Greedy under a repetition penalty, token for token as transformers' ``generate`` gives it (the penalty over
    the prompt and the tokens generated so far), for a penalty above 1 and one below, in one batch."""
    from tests.support.reference import _hf_model

    model = _hf_model(smollm2_dir)
    prompts = ["List three prime numbers:", "def fibonacci(n):"]
    penalties = [1.3, 0.85]
    out = smollm2.generate(prompts, [SamplingParams(max_tokens=16, repetition_penalty=p) for p in penalties])
    for prompt, penalty, result in zip(prompts, penalties, out):
        ids = smollm2.tokenize(prompt)
        expected = model.generate(torch.tensor([ids]), do_sample=False, repetition_penalty=penalty, max_new_tokens=16,
                                  pad_token_id=smollm2.tokenizer.eos_token_id)[0, len(ids):].tolist()
        if expected[-1] in smollm2.eos_token_ids:  # transformers keeps the EOS that stopped it; the engine does not
            expected.pop()
        assert result["token_ids"] == expected, (prompt, penalty)
    plain = smollm2.generate(prompts, SamplingParams(max_tokens=16))
    assert all(p["token_ids"] != r["token_ids"] for p, r in zip(plain, out))  # the penalties changed the output
