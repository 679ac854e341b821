"""Bad parameters fail at construction with a specific exception and a message that names the problem."""

from __future__ import annotations

import pytest

from core import InvalidParamsError, LLM, SamplingParams
from core.config import EngineConfig


@pytest.mark.parametrize("kwargs, fragment", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": -2}, "top_k"),
    ({"seed": 1.5}, "seed"),
    ({"seed": "7"}, "seed"),
    ({"seed": 2 ** 63}, "fits in 64 bits"),  # the sampler keeps seeds as int64
    ({"seed": -2 ** 63 - 1}, "fits in 64 bits"),
])
def test_sampling_params_validation(kwargs, fragment):
    with pytest.raises(InvalidParamsError, match=fragment):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"page_size": 0}, "page_size"),
    ({"cache": "lru"}, "unknown cache"),
    ({"attention": "magic"}, "unknown attention backend"),
    ({"max_running_req": 4, "num_pages": 2}, "one page per request row"),
    ({"dtype": "float8"}, "unknown dtype"),
])
def test_engine_config_validation(kwargs, fragment):
    with pytest.raises(InvalidParamsError, match=fragment):
        EngineConfig(**kwargs)


def test_bad_requests_get_error_results_while_others_complete(model_dirs):
    llm = LLM(model_dirs["llama"], max_running_req=2, max_seq_len=64)
    out = llm.generate([[1, 2, 3], [], [1, 99999], list(range(60)), [4, 5]],
                       SamplingParams(max_tokens=8, ignore_eos=True))
    assert [r["finish_reason"] for r in out] == ["length", "error", "error", "error", "length"]
    assert "empty prompt" in out[1]["error"]
    assert "outside the vocabulary" in out[2]["error"]
    assert "exceeds the context" in out[3]["error"]
    assert len(out[0]["token_ids"]) == 8 and len(out[4]["token_ids"]) == 8
    assert llm.stats()["free_rows"] == 2


def test_mismatched_params_list_is_rejected(model_dirs):
    llm = LLM(model_dirs["llama"], max_running_req=2)
    with pytest.raises(InvalidParamsError, match="2 sampling params for 3 prompts"):
        llm.generate([[1], [2], [3]], [SamplingParams(), SamplingParams()])
