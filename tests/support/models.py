"""Small random-weight checkpoints made on the spot, so tests cover every family without any download.

Each is a real Hugging Face directory (config.json, safetensors, a byte-level tokenizer), built with
transformers' own config and model classes and a fixed seed. A large ``initializer_range`` spreads the
logits so greedy decoding produces varied tokens instead of repeating one.
"""

from __future__ import annotations

from pathlib import Path

import torch

FAMILIES = ("llama", "qwen2", "qwen3")  # the architectures every correctness test runs on
VOCAB = 320
EOS_ID = 257


def byte_tokenizer():
    """A byte-level BPE tokenizer with no merges: every byte is a token, nothing to download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab["<bos>"] = 256
    vocab["<eos>"] = EOS_ID
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>")


def make_config(family: str, **overrides):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  initializer_range=0.5, eos_token_id=EOS_ID, bos_token_id=256, tie_word_embeddings=False,
                  rms_norm_eps=1e-6)
    common.update(overrides)
    if family == "llama":
        return LlamaConfig(**common)
    if family == "qwen2":
        return Qwen2Config(**common)
    if family == "qwen3":
        common.setdefault("head_dim", 16)
        return Qwen3Config(**common)
    raise ValueError(family)


def save_random_model(path: Path, family: str, seed: int = 0, **overrides) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = make_config(family, **overrides)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if family == "qwen2":  # random biases so the qkv bias path matters
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    model.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return path
