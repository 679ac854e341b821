"""Models by name from the local Hugging Face cache (never downloaded), and ``minisgl models`` listing them."""

from __future__ import annotations

import json
import shutil
from importlib import metadata
from importlib.metadata import EntryPoint

import pytest

from core.models.weights import download_command
from tests.support.cli import assert_user_error, json_lines, run, write


@pytest.fixture
def hub(tmp_path, model_dirs, monkeypatch):
    """A Hugging Face cache laid out as huggingface_hub leaves it: one supported model (a test checkpoint at
    the revision refs/main names) and one whose architecture the engine does not implement."""
    cache = tmp_path / "hub"
    for name, arch in (("org--tiny", None), ("other--gpt", "GPT2LMHeadModel")):
        repo = cache / f"models--{name}"
        snapshot = repo / "snapshots" / "abc"
        shutil.copytree(model_dirs["llama"], snapshot)
        (repo / "refs").mkdir()
        write(repo / "refs" / "main", "abc")
        if arch:
            config = json.loads((snapshot / "config.json").read_text())
            write(snapshot / "config.json", json.dumps({**config, "architectures": [arch]}))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_a_model_is_loaded_by_name_from_the_local_cache(hub, model_dirs, tmp_path):
    prompts = write(tmp_path / "p.txt", "hello there\n")
    by_name = run("generate", prompts, "--model", "org/tiny", "-n", "3", "--json")
    by_path = run("generate", prompts, "--model", model_dirs["llama"], "-n", "3", "--json")
    assert by_name.exit_code == 0, by_name.stderr
    assert json_lines(by_name.stdout)[0]["token_ids"] == json_lines(by_path.stdout)[0]["token_ids"]


def test_a_name_not_in_the_cache_says_models_are_never_downloaded(hub, tmp_path):
    prompts = write(tmp_path / "p.txt", "hello\n")
    result = run("generate", prompts, "--model", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert_user_error(result, "models are never downloaded")  # at once: the only line on stderr
    assert str(hub / "models--HuggingFaceTB--SmolLM2-135M-Instruct") in result.stderr
    # the download command of the huggingface_hub installed here: `hf` since it ships that command
    assert f"'{download_command('HuggingFaceTB/SmolLM2-135M-Instruct')}'" in result.stderr


def test_the_download_command_is_the_installed_huggingface_hubs(monkeypatch):
    class Shipped:
        def __init__(self, *names):
            self.entry_points = [EntryPoint(name, "x:y", "console_scripts") for name in names]

    monkeypatch.setattr(metadata, "distribution", lambda name: Shipped("huggingface-cli"))
    assert download_command("a/b") == "huggingface-cli download a/b"
    monkeypatch.setattr(metadata, "distribution", lambda name: Shipped("huggingface-cli", "hf"))
    assert download_command("a/b") == "hf download a/b"


def test_models_lists_the_embedded_model_the_families_and_the_cache(hub):
    result = run("models")
    assert result.exit_code == 0, result.stderr
    assert "SmolLM2-135M-Instruct" in result.stdout
    assert "LlamaForCausalLM" in result.stdout and "Qwen3ForCausalLM" in result.stdout
    lines = result.stdout.splitlines()
    assert any("org/tiny" in ln and "LlamaForCausalLM (llama)" in ln for ln in lines), result.stdout
    assert any("other/gpt" in ln and "unsupported: GPT2LMHeadModel" in ln for ln in lines), result.stdout
    assert str(hub) in result.stdout
    assert any(ln.split()[:2] == ["random:tiny-qwen3", "qwen3,"] for ln in lines), result.stdout
    listed = json.loads(run("models", "--json").stdout)
    assert [m["name"] for m in listed["cached"]] == ["org/tiny", "other/gpt"]
    assert "random:tiny-qwen3" in [m["name"] for m in listed["random"]]
