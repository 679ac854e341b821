"""The model shape the engine needs, read from a Hugging Face config by ``ModelConfig.from_hf``, which accepts
transformers 4's and 5's spellings so the rest of the engine never has to care."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.errors import UnsupportedModelError

# architecture name -> family. The families share one decoder and differ only in the flags below.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. ``kind`` is 'default' (none) or 'llama3'."""

    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2 puts a bias on q, k and v
    qk_norm: bool  # Qwen3 RMS-normalises q and k per head before RoPE
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    eos_token_ids: tuple[int, ...] = ()

    def tp_split_problem(self, size: int) -> str | None:
        """Why this model cannot be split over ``size`` tensor-parallel ranks, or None if it can. Attention heads,
        the MLP's intermediate size and KV heads are divided evenly, except that fewer KV heads than ranks are each
        replicated on ``size / num_kv_heads`` ranks."""
        if self.num_heads % size:
            return f"the model's {self.num_heads} attention heads cannot be split over {size} ranks"
        if self.intermediate_size % size:
            return f"the model's MLP size {self.intermediate_size} cannot be split over {size} ranks"
        kv = self.num_kv_heads
        if (kv >= size and kv % size) or (kv < size and size % kv):
            return f"the model's {kv} KV heads can be neither split nor replicated evenly over {size} ranks"
        return None

    @classmethod
    def from_hf(cls, hf: Any, eos_token_ids: tuple[int, ...] = ()) -> "ModelConfig":
        """Build from a transformers config object (or anything with the same attributes)."""
        archs = list(getattr(hf, "architectures", None) or [])
        family = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if family is None:
            family = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}.get(getattr(hf, "model_type", ""))
        if family is None:
            names = ", ".join(archs) or getattr(hf, "model_type", "unknown")
            supported = ", ".join(SUPPORTED_ARCHITECTURES)
            raise UnsupportedModelError(f"unsupported architecture {names}; supported: {supported}")
        num_heads = hf.num_attention_heads
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // num_heads
        rope = _rope_parameters(hf)
        return cls(
            family=family,
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_layers=hf.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(hf, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            rms_norm_eps=hf.rms_norm_eps,
            rope_theta=float(rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))),
            max_position_embeddings=hf.max_position_embeddings,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            qkv_bias=family == "qwen2" or bool(getattr(hf, "attention_bias", False)),
            qk_norm=family == "qwen3",
            rope_scaling=_rope_scaling(rope),
            eos_token_ids=eos_token_ids,
        )


def _rope_parameters(hf: Any) -> dict:
    """transformers 5 keeps theta and scaling in ``rope_parameters``; 4.x had ``rope_theta``/``rope_scaling``."""
    params = dict(getattr(hf, "rope_parameters", None) or {})
    if (legacy := getattr(hf, "rope_scaling", None)) and not params.get("rope_type"):
        params.update(legacy)
    if "rope_theta" not in params and getattr(hf, "rope_theta", None) is not None:
        params["rope_theta"] = hf.rope_theta
    return params


def _rope_scaling(rope: dict) -> RopeScaling:
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind == "default":
        return RopeScaling()
    if kind != "llama3":
        raise UnsupportedModelError(f"unsupported RoPE scaling {kind!r}; supported: default, llama3")
    return RopeScaling(kind="llama3", factor=float(rope["factor"]),
                       low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
                       high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
                       original_max_position_embeddings=int(rope.get("original_max_position_embeddings", 8192)))
