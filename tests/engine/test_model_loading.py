"""Every way a model can fail to load gives a specific error naming the file, and leaves no broken cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from core import LLM, ModelLoadError, UnsupportedModelError
from core.models.weights import default_gguf_path


@pytest.fixture
def broken(tmp_path, model_dirs) -> Path:
    """A private copy of a good checkpoint, for a test to damage."""
    return Path(shutil.copytree(model_dirs["llama"], tmp_path / "model"))


def test_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        LLM(str(tmp_path / "nowhere"))


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="has no config.json"):
        LLM(str(tmp_path))


def test_invalid_config_json(broken):
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="config.json is not valid JSON"):
        LLM(str(broken))


def test_unsupported_architecture(broken):
    config = json.loads((broken / "config.json").read_text())
    config.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="unsupported architecture GPT2LMHeadModel"):
        LLM(str(broken))


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_safetensors_names_the_file(broken, damage):
    weights = broken / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"not a tensor file" * 8)
    with pytest.raises(ModelLoadError, match=r"model\.safetensors.*truncated or corrupt"):
        LLM(str(broken))


def test_missing_tensor_is_named(broken):
    from safetensors.torch import load_file, save_file

    tensors = load_file(broken / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="lacks 1 tensor, e.g. model.layers.1.mlp.down_proj.weight"):
        LLM(str(broken))


def test_missing_tokenizer(broken):
    for path in broken.glob("tokenizer*"):
        path.unlink()
    with pytest.raises(ModelLoadError, match="has no tokenizer"):
        LLM(str(broken))


def test_plain_file_that_is_not_gguf(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(ModelLoadError, match="not a .gguf"):
        LLM(str(path))


def test_truncated_gguf_leaves_no_cache_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("MINISGL_HOME", str(tmp_path / "home"))
    truncated = tmp_path / "model.gguf"
    with open(default_gguf_path(), "rb") as src:
        truncated.write_bytes(src.read(1 << 20))
    with pytest.raises(ModelLoadError, match="could not read GGUF file .*model.gguf"):
        LLM(str(truncated))
    leftovers = [p for p in (tmp_path / "home").rglob("*") if p.is_file()]
    assert leftovers == []
    # and the next start converts cleanly instead of tripping over a half-written directory
    with pytest.raises(ModelLoadError, match="could not read GGUF file"):
        LLM(str(truncated))


def test_a_whole_checkpoint_tensor_is_adopted_and_a_part_copied():
    from core.layers.fill import fill

    param = torch.nn.Parameter(torch.empty(4, 3), requires_grad=False)
    whole = torch.arange(12.0).view(4, 3)
    fill(param, whole)
    assert param.data.data_ptr() == whole.data_ptr()  # no copy
    fused = torch.nn.Parameter(torch.zeros(6, 3), requires_grad=False)
    fill(fused, whole[:2], offset=4)  # one block of a fused weight: copied into place
    assert torch.equal(fused.data[4:], whole[:2]) and fused.data[4:].data_ptr() != whole.data_ptr()
    cast = torch.nn.Parameter(torch.empty(4, 3, dtype=torch.float64), requires_grad=False)
    fill(cast, whole)
    assert cast.dtype == torch.float64 and torch.equal(cast.data, whole.double())
