"""Float32 weights made of 4-bit codes (core/kernels/cpu/four_bit.py), read as the codes by the C GEMM and the C decode
step, on every architecture: a random checkpoint whose decoder linears are put into a Q4_1 GGUF's form, run with
the 4-bit reading and without it, must give the same log-probabilities bit for bit."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from core import LLM, SamplingParams
from core.kernels.cpu import decode as cpu_decode
from core.kernels.cpu.decode import FourBitRows
from core.kernels.cpu.features import cpu_features
from core.kernels.cpu.gemm import four_bit_panels
from core.kernels.cpu.four_bit import q4_codes, q4_rows
from tests.support.models import FAMILIES
from tests.support.prompts import varied_prompts

REASON = cpu_decode.unsupported_reason(cpu_features().flags) or cpu_decode.load_library().reason
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def as_four_bit(weight: torch.Tensor) -> torch.Tensor:
    """The weight as a Q4_1 GGUF would give it back: per block of 32 inputs float16 d and m, codes 0..15."""
    n, k = weight.shape
    blocks = weight.reshape(n, k // 32, 32)
    m = blocks.amin(-1, keepdim=True).half().float()
    d = ((blocks.amax(-1, keepdim=True) - m) / 15).half().float()
    codes = ((blocks - m) / d).round().clamp(0, 15)
    return (d * codes + m).reshape(n, k)


def four_bit_checkpoint(source: str, target: Path) -> str:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.rsplit(".", 1)[-1] in LINEARS:
                module.weight.copy_(as_four_bit(module.weight))
    model.save_pretrained(target)
    for extra in Path(source).glob("tokenizer*"):
        shutil.copy(extra, target)
    return str(target)


def test_rows_hold_the_codes_low_then_high_nibble_and_the_blocks_scales():
    weight = as_four_bit(torch.randn(3, 64))
    codes, d, m = q4_codes(weight)
    rows = q4_rows((codes, d, m))
    assert rows.shape == (3, 2, 24) and rows.dtype == torch.uint8
    assert torch.equal(rows[..., :16] & 15, codes.reshape(3, 2, 32)[..., :16])
    assert torch.equal(rows[..., :16] >> 4, codes.reshape(3, 2, 32)[..., 16:])
    assert torch.equal(rows[..., 16:].contiguous().view(torch.float32), torch.stack([d, m], -1))


@pytest.mark.skipif(bool(REASON), reason=REASON or "the C decode step runs here")
@pytest.mark.parametrize("family", FAMILIES)
def test_the_four_bit_reading_gives_the_float32_weights_log_probabilities(model_dirs, tmp_path, monkeypatch, family):
    path = four_bit_checkpoint(model_dirs[family], tmp_path / family)
    prompts, lengths = varied_prompts(4, seed=3)
    params = [SamplingParams(max_tokens=n + 4 * i, ignore_eos=True, logprobs=0) for i, n in enumerate(lengths)]
    four = LLM(path, max_running_req=4)
    assert four.engine.cpu_paths.decode_step is not None
    assert all(isinstance(layer.down, FourBitRows) for layer in four.engine.cpu_paths.decode_step.layers_kept)
    if four.engine.plan.kernels.c_gemm:  # batches too: 4 fused linears a layer
        assert four_bit_panels(four.engine.model) == 4 * four.engine.model_config.num_layers
    got = four.generate(prompts, params)
    monkeypatch.setenv("MINISGL_DISABLE_FOUR_BIT_WEIGHTS", "1")
    plain = LLM(path, max_running_req=4)
    assert not isinstance(plain.engine.cpu_paths.decode_step.layers_kept[0].down, FourBitRows)
    want = plain.generate(prompts, params)
    assert [r["token_ids"] for r in got] == [r["token_ids"] for r in want]
    assert [r["logprobs"] for r in got] == [r["logprobs"] for r in want]
