"""The model's sampling defaults: read from a generation_config.json as vLLM reads it, overridden, and given to
requests that leave a field out; a request's own value always wins."""

from __future__ import annotations

import json

import pytest

from core import InvalidParamsError, LLM, SamplingParams
from core.config import EngineConfig
from core.generation import sampling_defaults


def _model_dir(tmp_path, **fields):
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "do_sample": True, **fields}))
    return tmp_path


def test_the_sampling_fields_of_a_generation_config_in_transformers_names(tmp_path):
    path = _model_dir(tmp_path, temperature=0.6, top_p=0.95, top_k=0, max_new_tokens=64, repetition_penalty=1.1)
    defaults = sampling_defaults(path)
    assert defaults.values == {"temperature": 0.6, "top_p": 0.95, "top_k": -1, "max_tokens": 64,
                               "repetition_penalty": 1.1}  # top_k 0 is transformers' "off"
    assert "from the model's generation_config.json" in defaults.describe()
    assert defaults.params(max_tokens=8, temperature=0.0) == SamplingParams(
        max_tokens=8, temperature=0.0, top_p=0.95, top_k=-1, repetition_penalty=1.1)  # given values win
    assert sampling_defaults(path, "none").values == {}
    assert sampling_defaults(None, "auto").values == {}  # a random: model has no files
    over = sampling_defaults(path, str(path), '{"temperature": 0.2, "min_p": 0.05}')
    assert over.values["temperature"] == 0.2 and over.values["min_p"] == 0.05 and over.values["top_p"] == 0.95
    assert "and the override" in over.describe()


@pytest.mark.parametrize("options, fragment", [
    ({"generation_config": "nowhere"}, "generation_config must be 'auto', 'none' or a directory"),
    ({"override_generation_config": "{temperature: 1}"}, "not valid JSON"),
    ({"override_generation_config": '{"max_tokens": 5}'}, "unknown field 'max_tokens'"),
    ({"override_generation_config": {"top_p": 0}}, "top_p must be in (0, 1]"),
])
def test_bad_generation_options_are_refused_before_any_load(options, fragment):
    with pytest.raises(InvalidParamsError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        EngineConfig(**options)


def test_a_generation_config_with_a_bad_value_names_its_file(tmp_path):
    with pytest.raises(InvalidParamsError, match="generation_config.json: temperature must be"):
        sampling_defaults(_model_dir(tmp_path, temperature=-1))


def test_llm_gives_its_defaults_to_requests_without_params(model_dirs):
    """SamplingParams given are taken as they are; without them, the model's defaults over SamplingParams' own."""
    llm = LLM(model_dirs["llama"], override_generation_config={"max_new_tokens": 12, "repetition_penalty": 1.5})
    prompt = [10, 20, 30, 40]
    by_default = llm.generate([prompt])[0]["token_ids"]
    assert by_default == llm.generate([prompt], SamplingParams(max_tokens=12, repetition_penalty=1.5))[0]["token_ids"]
    assert by_default != llm.generate([prompt], SamplingParams(max_tokens=12))[0]["token_ids"]
