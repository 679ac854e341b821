"""Build the decoder for a model directory and fill it from safetensors, tensor by tensor.

Checkpoint names map onto the decoder's modules by name, q/k/v and gate/up onto their fused layer with a shard
name; a layer split across ranks takes its own slice in ``load``. Every parameter must be filled: a missing
tensor is an error naming it, never silently random weights.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from core.errors import ModelLoadError, one_line
from core import model_config
from core.model_config import ModelConfig, RopeScaling
from core.kernels.derived import DerivedCache
from core.layers.fill import fill
from core.models.decoder import CausalLM
from core.models.random_spec import RandomSpec, fill_random
from core.models.weights import model_config_cache_path
from core.words import plural

# checkpoint module name -> (decoder module name, shard)
_FUSED = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
          "gate_proj": ("gate_up_proj", "gate"), "up_proj": ("gate_up_proj", "up")}


def read_model_config(model_dir: Path | RandomSpec) -> ModelConfig:
    """The model's shape, read through transformers' AutoConfig (which fills in each family's defaults) once, and
    kept as JSON beside the converted models: AutoConfig imports the family's modules and much of
    torch.distributed, a good part of a start, to read a few numbers."""
    if isinstance(model_dir, RandomSpec):
        return model_dir.config
    cache = model_config_cache_path(model_dir, (Path(model_config.__file__), Path(__file__)))
    if cache is not None and (cfg := _cached_config(cache)) is not None:
        return cfg
    from transformers import AutoConfig

    try:
        hf = AutoConfig.from_pretrained(model_dir)
    except Exception as exc:
        raise ModelLoadError(f"cannot read {model_dir / 'config.json'}: {one_line(exc)}") from exc
    cfg = ModelConfig.from_hf(hf, eos_token_ids=_eos_token_ids(model_dir, hf))
    if cache is not None:
        _store_config(cache, cfg)
    return cfg


def _cached_config(path: Path) -> ModelConfig | None:
    """The config kept at ``path``, or None when there is none or it cannot be read (it is then read afresh)."""
    try:
        fields = json.loads(path.read_text())
        fields["rope_scaling"] = RopeScaling(**fields["rope_scaling"])
        fields["eos_token_ids"] = tuple(fields["eos_token_ids"])
        return ModelConfig(**fields)
    except Exception:
        return None


def _store_config(path: Path, cfg: ModelConfig) -> None:
    """Written to a temporary file renamed into place; a failure to write only costs the next start the read."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".writing-", suffix=".json", dir=path.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(dataclasses.asdict(cfg), f)
        os.replace(tmp, path)
    except OSError:
        pass
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _eos_token_ids(model_dir: Path, hf: object) -> tuple[int, ...]:
    """EOS ids from generation_config.json when present (it may list several), else from config.json."""
    value = getattr(hf, "eos_token_id", None)
    gen = model_dir / "generation_config.json"
    if gen.is_file():
        try:
            value = json.loads(gen.read_text()).get("eos_token_id", value)
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"cannot read {gen}: {exc}") from exc
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (int(value),)


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def load_model(model_dir: Path | RandomSpec, cfg: ModelConfig, device: torch.device, dtype: torch.dtype,
               max_positions: int, derived: DerivedCache | None = None) -> CausalLM:
    """The decoder filled from ``model_dir``. On a CPU the fused weights, the only ones a load copies, are read
    back from ``derived`` where it holds them, and kept there for the next start where it does not."""
    with _default_dtype(dtype), torch.device(device):
        model = CausalLM(cfg, max_positions)
    if isinstance(model_dir, RandomSpec):
        fill_random(model, model_dir)
        return model.eval()
    params = dict(model.named_parameters())
    fused = {name: module for name, module in model.named_modules() if len(getattr(module, "blocks", {})) > 1}
    adopted = _adopt_fused(fused, derived) if derived is not None and device.type == "cpu" else set()
    filled: set[str] = set()
    for name, tensor in _checkpoint_tensors(model_dir):
        filled |= _load_one(model, params, name, tensor, adopted)
    if derived is not None and device.type == "cpu":
        for name, module in fused.items():
            derived.get(f"fused:{name}.weight", lambda: (module.weight.data,))
    if missing := sorted(set(params) - filled):
        raise ModelLoadError(f"checkpoint in {model_dir} lacks {plural(len(missing), 'tensor')}, e.g. {missing[0]}; "
                             "is the download complete?")
    return model.eval()


def _checkpoint_tensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    if not (files := sorted(model_dir.glob("*.safetensors"))):
        raise ModelLoadError(f"{model_dir} has no .safetensors weights")
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        except Exception as exc:
            raise ModelLoadError(f"cannot read weights file {file}: {one_line(exc)} (truncated or corrupt?)") from exc


def _adopt_fused(fused: dict[str, torch.nn.Module], derived: DerivedCache) -> set[str]:
    """The fused layers whose weight ``derived`` holds (of the right shape and dtype), that weight adopted."""
    adopted = set()
    for name, module in fused.items():
        found = derived.peek(f"fused:{name}.weight")
        if found is not None and found[0].shape == module.weight.shape and found[0].dtype == module.weight.dtype:
            module.weight.data = found[0]
            adopted.add(name)
    return adopted


def _load_one(model: CausalLM, params: dict[str, torch.nn.Parameter], name: str, tensor: torch.Tensor,
              adopted: set[str] = frozenset()) -> set[str]:
    """Put one checkpoint tensor into the decoder; return the parameter names it filled. The weight of a layer in
    ``adopted`` is in place already (read back whole): its shards only count as filled."""
    if "rotary_emb" in name:
        return set()
    module_path, _, kind = name.rpartition(".")
    parent, _, leaf = module_path.rpartition(".")
    leaf, shard = _FUSED.get(leaf, (leaf, ""))
    target_path = f"{parent}.{leaf}" if parent else leaf
    try:
        module = model.get_submodule(target_path)
    except AttributeError:
        raise ModelLoadError(f"checkpoint tensor {name} has no place in the {model.config.family} decoder") from None
    if target_path in adopted and kind == "weight":
        return {f"{target_path}.weight"}
    with torch.no_grad():
        if hasattr(module, "load"):
            module.load(tensor, shard, kind)
        else:
            fill(getattr(module, kind), tensor)
    if target_path == "lm_head":
        return {"lm_head.inner.weight"} & set(params)
    return {f"{target_path}.{kind}"}
