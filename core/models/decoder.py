"""One decoder for every supported family: Llama, Qwen2 and Qwen3 differ only by flags in ModelConfig. Module
names follow the Hugging Face checkpoints (``model.layers.N.self_attn`` ...), so the loader maps tensors by name."""

from __future__ import annotations

import torch
from torch import nn

from core.layers.attention import SelfAttention
from core.layers.embedding import LMHead, VocabParallelEmbedding
from core.layers.mlp import GatedMLP
from core.layers.norm import RMSNorm
from core.layers.rope import RotaryEmbedding
from core.model_config import ModelConfig


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = SelfAttention(cfg, layer_id, rope)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each block takes the norm in front of it, so a small batch runs norm and projection as one kernel.
        ``residual`` is None on the first layer (the embeddings are the residual stream)."""
        x, residual = self.self_attn.forward_after_norm(positions, x, residual, self.input_layernorm)
        return self.mlp.forward_after_norm(x, residual, self.post_attention_layernorm)


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.rope = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, self.rope) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.rope.begin_forward()
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        x, _ = self.norm.forward_with_residual(x, residual)
        return x


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderModel(cfg, max_positions)
        self.lm_head = LMHead(cfg.vocab_size, cfg.hidden_size,
                              self.model.embed_tokens if cfg.tie_word_embeddings else None)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                logits_indices: torch.Tensor | None) -> torch.Tensor:
        """Logits only at ``logits_indices`` (each request's last token), or every row for None (a graphed decode
        step, where gathering all rows would be a kernel for nothing). They stay in the model's dtype: the sampler
        reads them in float32 inside its own fused pass, saving a float32 copy of [batch, vocab] every step."""
        hidden = self.model(input_ids, positions)
        return self.lm_head(hidden if logits_indices is None else hidden[logits_indices])
