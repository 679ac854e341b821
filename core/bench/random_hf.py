"""A transformers model holding the very weights of a ``random:`` spec, so the baselines can run on it.

A random spec has no checkpoint directory, but its weights are a pure function of the spec, the device and the
dtype (``fill_random``). So the engine's decoder is built once more on a single rank, and its tensors are copied
into transformers' model of the same family under transformers' names; the fused layers (q/k/v in
``qkv_proj``, gate/up in ``gate_up_proj``) are split back by the row offsets they were packed at.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from core.errors import UnsupportedModelError
from core.models.decoder import CausalLM
from core.models.loader import load_model
from core.models.random_spec import RandomSpec

# a fused layer's shard name -> the checkpoint module it came from
_SHARD_MODULES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "gate": "gate_proj", "up": "up_proj"}


def hf_config(spec: RandomSpec) -> Any:
    """transformers' config for the spec's shape (Qwen3 only: every random spec is a Qwen3 shape)."""
    from transformers import Qwen3Config

    cfg = spec.config
    if cfg.family != "qwen3":
        raise UnsupportedModelError(f"no transformers twin for random {cfg.family} models")
    return Qwen3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings, attention_bias=cfg.qkv_bias,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        architectures=["Qwen3ForCausalLM"])


def hf_state_dict(model: CausalLM) -> Iterator[tuple[str, torch.Tensor]]:
    """The single-rank decoder's tensors under transformers' names, fused layers split back."""
    for name, param in model.named_parameters():
        module_path, _, kind = name.rpartition(".")
        module = model.get_submodule(module_path)
        if module_path == "lm_head.inner":
            yield f"lm_head.{kind}", param.data
        elif hasattr(module, "offsets"):
            parent = module_path.rpartition(".")[0]
            for shard, offset in module.offsets.items():
                rows = module.blocks[shard][0]
                yield f"{parent}.{_SHARD_MODULES[shard]}.{kind}", param.data[offset:offset + rows]
        else:
            yield name, param.data


def random_hf_model(spec: RandomSpec, device: torch.device, dtype: torch.dtype) -> Any:
    """transformers' model with the same weights as a one-rank engine built from ``spec`` on ``device``."""
    from transformers import AutoModelForCausalLM

    config = hf_config(spec)
    source = load_model(spec, spec.config, device, dtype, max_positions=1)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    state = dict(hf_state_dict(source))
    result = model.load_state_dict(state, strict=False)
    del source, state
    missing = [k for k in result.missing_keys if not (k == "lm_head.weight" and spec.config.tie_word_embeddings)]
    if missing or result.unexpected_keys:
        raise UnsupportedModelError(f"transformers twin of {spec}: missing {missing}, "
                                    f"unexpected {result.unexpected_keys}")
    return model.eval()
