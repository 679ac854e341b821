"""The reference: transformers' greedy decoding, one prompt at a time, float32 on the CPU.

A plain loop over the model with its KV cache (what ``generate`` does greedily) rather than ``generate`` with
``min_new_tokens``, which would suppress EOS and so differ from an engine that merely ignores it.
"""

from __future__ import annotations

import warnings
from functools import lru_cache

import torch


@lru_cache(maxsize=8)
def _hf_model(model_dir: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_greedy(model_dir: str, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Exactly max_new_tokens greedy tokens (EOS ignored)."""
    model = _hf_model(model_dir)
    inputs, past, tokens = torch.tensor([prompt_ids]), None, []
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # past_key_values is being renamed across versions
        for _ in range(max_new_tokens):
            out = model(input_ids=inputs, past_key_values=past, use_cache=True)
            past = out.past_key_values
            token = int(out.logits[0, -1].argmax())
            tokens.append(token)
            inputs = torch.tensor([[token]])
    return tokens
