"""A warm start reads back what the kernels derive from the weights and the model's shape, instead of deriving
them again; a changed weights file is never served a stale entry, and a corrupt entry is rebuilt, not fatal.

Nothing is timed here (scripts/cli_startup.py measures the start); what is checked is that the cache files are
written beside the converted model, read back, keyed on the weights, and that tokens stay the same."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open

from core.kernels.derived import ENTRIES_KEY, DerivedCache
from core.models.weights import derived_cache_path
from tests.support.cli import json_lines, run, write


def generate_tokens(prompts: Path) -> list[list[int]]:
    result = run("generate", prompts, "--max-tokens", "6", "--json")
    assert result.exit_code == 0, result.stderr
    return [row["token_ids"] for row in json_lines(result.stdout)]


def test_the_embedded_model_starts_from_its_cache_and_survives_a_corrupt_one(smollm2_dir, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(Path(smollm2_dir).parent)  # the converted model, not converted again
    monkeypatch.setenv("MINISGL_HOME", str(home))
    monkeypatch.delenv("MINISGL_DISABLE_DERIVED_CACHE", raising=False)
    prompts = write(tmp_path / "p.txt", "The capital of France is\nList three prime numbers:\n")

    derived_fresh = generate_tokens(prompts)
    [derived] = (home / "derived").glob(f"{Path(smollm2_dir).name}-*/*.safetensors")
    [config] = (home / "derived" / "configs").glob("*.json")
    written = derived.stat().st_mtime_ns, config.stat().st_mtime_ns
    with safe_open(str(derived), framework="pt") as f:
        entries = json.loads(f.metadata()[ENTRIES_KEY])
    assert {"fused:model.layers.0.self_attn.qkv_proj.weight", "lm_head.int8",
            "q4_codes:model.layers.0.mlp.down_proj"} <= set(entries), sorted(entries)[:8]

    assert generate_tokens(prompts) == derived_fresh  # read back, and nothing rewritten
    assert (derived.stat().st_mtime_ns, config.stat().st_mtime_ns) == written

    derived.write_bytes(b"not a safetensors file")
    config.write_text("{")
    assert generate_tokens(prompts) == derived_fresh  # derived again, and rewritten whole
    assert derived.stat().st_size > 1 << 20 and config.read_text().startswith("{\"family\"")
    monkeypatch.setenv("MINISGL_DISABLE_DERIVED_CACHE", "1")  # the switch: derived again, the files left alone
    written = derived.stat().st_mtime_ns
    assert generate_tokens(prompts) == derived_fresh and derived.stat().st_mtime_ns == written
    assert not [p for p in derived.parent.iterdir() if p.name.startswith(".writing-")]


def test_the_key_follows_the_weight_files(tmp_path, monkeypatch):
    monkeypatch.delenv("MINISGL_DISABLE_DERIVED_CACHE", raising=False)
    weights = tmp_path / "model"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"x" * 10)
    first = derived_cache_path(weights, "float32-rank0of1", "source")
    assert derived_cache_path(weights, "float32-rank0of1", "source") == first
    assert derived_cache_path(weights, "float32-rank0of1", "edited") != first  # another kernel source
    assert derived_cache_path(weights, "bfloat16-rank0of1", "source") != first
    stat = (weights / "model.safetensors").stat()
    os.utime(weights / "model.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert derived_cache_path(weights, "float32-rank0of1", "source") != first  # the weights changed


def test_entries_round_trip_and_an_unreadable_file_is_derived_again(tmp_path):
    path = tmp_path / "d" / "k.safetensors"
    cache = DerivedCache(path)
    calls = []

    def derive():
        calls.append(1)
        return torch.arange(6).view(2, 3)[:, 1:], torch.ones(2)  # a view of a larger tensor is written too

    values = cache.get("a", derive)
    assert cache.get("none", lambda: None) is None
    cache.save()
    again = DerivedCache(path)
    assert torch.equal(again.get("a", derive)[0], values[0]) and again.get("none", lambda: 1) is None
    assert len(calls) == 1
    path.write_bytes(b"\0" * 100)
    assert torch.equal(DerivedCache(path).get("a", derive)[1], torch.ones(2)) and len(calls) == 2


def test_entries_read_back_start_on_a_cache_line(tmp_path):
    """safetensors hands its tensors 8 bytes off a cache line; the C kernels read what the cache holds, so every
    entry read back starts where torch's own allocator would put it."""
    path = tmp_path / "derived.safetensors"
    written = DerivedCache(path)
    for n in (1, 3, 7):
        written.get(f"panel{n}", lambda n=n: (torch.arange(n * 1000, dtype=torch.uint8), torch.ones(n, 5)))
    written.save()
    read = DerivedCache(path)
    for n in (1, 3, 7):
        back = read.peek(f"panel{n}")
        assert back is not None and all(t.data_ptr() % 64 == 0 for t in back)
        assert torch.equal(back[0], torch.arange(n * 1000, dtype=torch.uint8))
        assert torch.equal(back[1], torch.ones(n, 5))
