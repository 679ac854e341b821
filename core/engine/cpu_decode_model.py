"""The engine's model and KV pool mapped onto the C decode step's records (core/kernels/cpu_decode.py).

It lives with the engine because it reads the decoder's module names; the kernel itself knows only tensors.
"""

from __future__ import annotations

import torch

from core.kernels.cpu_decode import CpuDecodeStep, DecodeShape, LayerWeights
from core.kvcache.pool import KVPool
from core.model_config import ModelConfig
from core.models.decoder import CausalLM


def build_cpu_decode(model: CausalLM, cfg: ModelConfig, pool: KVPool, max_len: int, threads: int) -> CpuDecodeStep:
    """The step over ``model``'s own weights and ``pool``'s buffers (nothing is copied); ``max_len``: the most
    tokens a request can hold (the page table's width)."""
    layers = []
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        layers.append(LayerWeights(
            input_norm=layer.input_layernorm.weight, qkv=attn.qkv_proj.weight, qkv_bias=attn.qkv_proj.bias,
            q_norm=attn.q_norm.weight if attn.q_norm is not None else None,
            k_norm=attn.k_norm.weight if attn.k_norm is not None else None,
            o_proj=attn.o_proj.weight, post_norm=layer.post_attention_layernorm.weight,
            gate_up=mlp.gate_up_proj.weight, down=mlp.down_proj.weight,
            k_cache=pool.k_layers[i], v_cache=pool.v_layers[i]))
    shape = DecodeShape(hidden=cfg.hidden_size, intermediate=cfg.intermediate_size, heads=cfg.num_heads,
                        kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, vocab=cfg.vocab_size,
                        eps=cfg.rms_norm_eps, qk_eps=cfg.rms_norm_eps)
    inner = model.model
    return CpuDecodeStep(shape, layers, inner.embed_tokens.weight.detach(), inner.norm.weight.detach(),
                         model.lm_head.weight.detach(), inner.rope.cos_sin, max_len, threads)
