"""Random-weight model specs: a known shape built without any file, reproducible, reading ids or bytes."""

from __future__ import annotations

import pytest

from core import LLM, ModelLoadError, SamplingParams
from core.models.random_spec import SPECS, ByteTokenizer, parse_random_spec


@pytest.fixture(scope="module")
def tiny() -> LLM:
    return LLM("random:tiny-qwen3", max_running_req=4)


def test_qwen3_0_6b_spec_has_the_published_shape():
    cfg = SPECS["qwen3-0.6b"].config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_layers) == (151936, 1024, 3072, 28)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (16, 8, 128)
    assert (cfg.rope_theta, cfg.rms_norm_eps, cfg.tie_word_embeddings, cfg.qk_norm) == (1e6, 1e-6, True, True)


def test_qwen3_8b_spec_has_the_published_shape_and_splits_over_two_ranks():
    cfg = SPECS["qwen3-8b"].config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_layers) == (151936, 4096, 12288, 36)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.tie_word_embeddings) == (32, 8, 128, False)
    assert cfg.tp_split_problem(2) is None and cfg.tp_split_problem(8) is None


def test_same_spec_gives_same_tokens_and_a_seed_changes_them(tiny):
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    first = tiny.generate([[1, 2, 3]], params)[0]
    again = LLM("random:tiny-qwen3", max_running_req=2).generate([[1, 2, 3]], params)[0]
    other = LLM("random:tiny-qwen3@7", max_running_req=2).generate([[1, 2, 3]], params)[0]
    assert first["token_ids"] == again["token_ids"]
    assert len(first["token_ids"]) == 8 and first["finish_reason"] == "length"
    assert other["token_ids"] != first["token_ids"]


def test_text_prompts_are_utf8_bytes(tiny):
    out = tiny.generate(["hé"], SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert out["prompt_tokens"] == len("hé".encode())
    assert out["text"] == ByteTokenizer().decode(out["token_ids"])


def test_byte_tokenizer_round_trips_text_and_shows_other_ids():
    tok = ByteTokenizer()
    ids = tok("naïve")["input_ids"]
    assert tok.decode(ids) == "naïve"
    assert tok.decode([104, 105, 300, 33]) == "hi<300>!"


@pytest.mark.parametrize("model, fragment", [
    ("random:nope", "unknown random model"),
    ("random:tiny-qwen3@x", "seed"),
])
def test_bad_spec_is_a_clear_error(model, fragment):
    with pytest.raises(ModelLoadError, match=fragment):
        parse_random_spec(model)
