"""Models with random weights, named by a spec such as ``random:qwen3-0.6b``: a real shape, no download.

Throughput does not depend on the weights' values when EOS is ignored, so a benchmark builds the shape on the
device in a second instead of reading a checkpoint. The weights come from a generator seeded per spec on the
model's device: two engines of one spec on one device hold the same weights, to be compared whatever their
attention backend. There is no tokenizer file: text is read and written as UTF-8 bytes (ids 0-255). Torch is
imported only to draw the weights, so ``minisgl models`` lists the specs without it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import groupby
from typing import TYPE_CHECKING

from core.errors import ModelLoadError
from core.model_config import ModelConfig

if TYPE_CHECKING:
    from torch import nn

PREFIX = "random:"


@dataclass(frozen=True)
class RandomSpec:
    """A model shape plus how to draw its weights."""

    name: str
    config: ModelConfig
    init_std: float = 0.02
    seed: int = 0

    def __str__(self) -> str:
        return PREFIX + self.name


def _qwen3(**fields) -> ModelConfig:
    return ModelConfig(**{"family": "qwen3", "qkv_bias": False, "qk_norm": True, "tie_word_embeddings": True,
                          "rms_norm_eps": 1e-6, "rope_theta": 1e6, **fields})


# name -> (shape, weight std). A large std on the small shapes spreads the logits, so greedy decoding gives
# varied tokens with clear margins rather than one token repeated or near-ties everywhere.
SPECS: dict[str, RandomSpec] = {
    "qwen3-0.6b": RandomSpec("qwen3-0.6b", _qwen3(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
        num_kv_heads=8, head_dim=128, max_position_embeddings=40960)),
    # large enough for tensor parallelism to pay on two GPUs (docs/tensor-parallel.md)
    "qwen3-8b": RandomSpec("qwen3-8b", _qwen3(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32,
        num_kv_heads=8, head_dim=128, max_position_embeddings=40960, tie_word_embeddings=False)),
    "small-qwen3": RandomSpec("small-qwen3", _qwen3(
        vocab_size=4096, hidden_size=512, intermediate_size=1024, num_layers=4, num_heads=8, num_kv_heads=4,
        head_dim=128, max_position_embeddings=4096), init_std=0.1),
    "tiny-qwen3": RandomSpec("tiny-qwen3", _qwen3(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
        head_dim=16, max_position_embeddings=512, tie_word_embeddings=False), init_std=0.5),
}


def parse_random_spec(model: str) -> RandomSpec:
    """``random:NAME`` or ``random:NAME@SEED``."""
    name, _, seed = model[len(PREFIX):].partition("@")
    if (spec := SPECS.get(name)) is None:
        raise ModelLoadError(f"unknown random model {name!r}; known: {', '.join(PREFIX + n for n in SPECS)}")
    if seed:
        if not seed.isdigit():
            raise ModelLoadError(f"the seed in {model!r} must be a non-negative integer")
        spec = replace(spec, seed=int(seed))
    return spec


def fill_random(model: nn.Module, spec: RandomSpec) -> None:
    """Draw every matrix from N(0, std) and set every norm weight to one, in a fixed parameter order."""
    import torch

    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(spec.seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, spec.init_std, generator=gen)


class ByteTokenizer:
    """Text as UTF-8 bytes, for models without a tokenizer file. Ids past 255 decode as ``<id>``."""

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": list(text.encode("utf-8"))}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        out = []
        for is_byte, run in groupby(ids, key=lambda token: 0 <= token < 256):
            out.append(bytes(run).decode("utf-8", errors="replace") if is_byte else "".join(f"<{t}>" for t in run))
        return "".join(out)
