"""The engine's model and KV pool mapped onto the C decode step's records (core/kernels/cpu_decode.py).

It lives with the engine because it reads the decoder's module names; the kernel itself knows only tensors.
A linear quantised by core/kernels/int8_weights.py hands over its int8 weight (its float32 one is freed).
"""

from __future__ import annotations

import torch

from core.kernels.cpu_decode import CpuDecodeStep, DecodeShape, LayerWeights
from core.kernels.int8_weights import Int8Weight
from core.kvcache.pool import KVPool
from core.model_config import ModelConfig
from core.models.decoder import CausalLM


def _linear_weight(module: torch.nn.Module) -> torch.Tensor | Int8Weight:
    """The int8 weight in the layer's ``packed`` slot where it was quantised, else its float32 weight."""
    return module.packed if isinstance(module.packed, Int8Weight) else module.weight.detach()


def build_cpu_decode(model: CausalLM, cfg: ModelConfig, pool: KVPool, max_len: int, threads: int) -> CpuDecodeStep:
    """The step over ``model``'s own weights and ``pool``'s buffers (nothing is copied); ``max_len``: the most
    tokens a request can hold (the page table's width)."""
    layers = []
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        layers.append(LayerWeights(
            input_norm=layer.input_layernorm.weight, qkv=_linear_weight(attn.qkv_proj),
            qkv_bias=attn.qkv_proj.bias,
            q_norm=attn.q_norm.weight if attn.q_norm is not None else None,
            k_norm=attn.k_norm.weight if attn.k_norm is not None else None,
            o_proj=_linear_weight(attn.o_proj), post_norm=layer.post_attention_layernorm.weight,
            gate_up=_linear_weight(mlp.gate_up_proj), down=_linear_weight(mlp.down_proj),
            k_cache=pool.k_layers[i], v_cache=pool.v_layers[i]))
    shape = DecodeShape(hidden=cfg.hidden_size, intermediate=cfg.intermediate_size, heads=cfg.num_heads,
                        kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, vocab=cfg.vocab_size,
                        eps=cfg.rms_norm_eps, qk_eps=cfg.rms_norm_eps)
    inner = model.model
    return CpuDecodeStep(shape, layers, inner.embed_tokens.weight.detach(), inner.norm.weight.detach(),
                         model.lm_head.weight.detach(), inner.rope.cos_sin, max_len, threads)
