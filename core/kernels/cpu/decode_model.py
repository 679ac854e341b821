"""The engine's model and KV pool mapped onto the C decode step's records (core/kernels/cpu/decode.py).

It reads the decoder's module names (core/models/decoder.py, without importing it: kernels sit below the
model); the kernel itself knows only tensors.
With ``int8`` the step reads int8 copies of the float32 weights (core/kernels/cpu/int8_weights.py), the LM head's
too (whose float32 weight, the embedding table when they are tied, stays for the input token's row lookup);
the torch layers keep their float32 weights for prefill and batches. With ``four_bit`` a float32 linear made of
4-bit codes (the embedded GGUF's) is read as those codes: the same floats from a fifth of the bytes.
"""

from __future__ import annotations

from dataclasses import astuple

import torch

from core.kernels.cpu.decode import CpuDecodeStep, DecodeShape, FourBitRows, LayerWeights, StepWeight, head_int8
from core.kernels.derived import DerivedCache
from core.kernels.cpu.four_bit import Q4Codes, q4_rows
from core.kernels.cpu.int8_weights import Int8Weight
from core.kvcache.pool import KVPool
from core.model_config import ModelConfig


def _linear_weight(name: str, module: torch.nn.Module, int8: bool, four_bit: dict[torch.nn.Module, Q4Codes],
                   cache: DerivedCache) -> StepWeight:
    """With ``int8`` an int8 copy of the layer's float32 weight; else its 4-bit codes where ``four_bit`` has them
    (the same floats); else that weight. Copies and codes are read back from ``cache`` by the layer's name."""
    if int8:
        return Int8Weight(*cache.get(f"int8:{name}", lambda: astuple(Int8Weight.quantize(module.weight))))
    if module in four_bit:
        return FourBitRows(cache.get(f"q4_rows:{name}", lambda: (q4_rows(four_bit[module]),))[0])
    return module.weight.detach()


def build_cpu_decode(model: torch.nn.Module, cfg: ModelConfig, pool: KVPool, max_len: int, threads: int,
                     int8: bool = False, int8_dots: bool = False,
                     four_bit: dict[torch.nn.Module, Q4Codes] | None = None,
                     cache: DerivedCache | None = None) -> CpuDecodeStep:
    """The step over ``model``'s own weights and ``pool``'s buffers (nothing is copied but the int8 copies that
    ``int8`` asks for); ``max_len``: the most tokens a request can hold (the page table's width); ``int8_dots``:
    integer dot products on int8 inputs (core/kernels/cpu/decode.c); ``four_bit``: the linears made of 4-bit codes,
    with their codes (core/kernels/cpu/four_bit.py's ``linear_codes``), read as the codes; ``cache``: where what is
    derived from the weights is read back from (core/kernels/derived.py)."""
    four_bit = four_bit or {}
    cache = cache or DerivedCache()
    names = {module: name for name, module in model.named_modules()}

    def linear(module: torch.nn.Module) -> StepWeight:
        return _linear_weight(names[module], module, int8, four_bit, cache)

    layers = []
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        layers.append(LayerWeights(
            input_norm=layer.input_layernorm.weight, qkv=linear(attn.qkv_proj),
            qkv_bias=attn.qkv_proj.bias,
            q_norm=attn.q_norm.weight if attn.q_norm is not None else None,
            k_norm=attn.k_norm.weight if attn.k_norm is not None else None,
            o_proj=linear(attn.o_proj), post_norm=layer.post_attention_layernorm.weight,
            gate_up=linear(mlp.gate_up_proj),
            down=linear(mlp.down_proj),
            k_cache=pool.k_layers[i], v_cache=pool.v_layers[i]))
    shape = DecodeShape(hidden=cfg.hidden_size, intermediate=cfg.intermediate_size, heads=cfg.num_heads,
                        kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, vocab=cfg.vocab_size,
                        eps=cfg.rms_norm_eps, qk_eps=cfg.rms_norm_eps)
    inner, head = model.model, model.lm_head.weight.detach()
    return CpuDecodeStep(shape, layers, inner.embed_tokens.weight.detach(), inner.norm.weight.detach(),
                         head_int8(head, cache) if int8 else head, inner.rope.cos_sin, max_len, threads,
                         int_dots=int8 and int8_dots, cache=cache)
