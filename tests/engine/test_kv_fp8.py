"""The fp8 KV cache: e4m3 values with one scale per (slot, KV head), read back as float32."""

from __future__ import annotations

import pytest
import torch

from core.config import EngineConfig
from core.errors import InvalidParamsError
from core.kvcache.pool import FP8_DTYPE, KVPool, dequantize_fp8, quantize_fp8


def test_quantize_keeps_each_heads_range_and_two_significant_digits():
    torch.manual_seed(0)
    x = torch.randn(64, 4, 32) * torch.tensor([1e-3, 1.0, 30.0, 1e3])[None, :, None]
    values, scale = quantize_fp8(x)
    assert values.dtype == FP8_DTYPE and scale.shape == (64, 4)
    back = dequantize_fp8(values, scale, torch.float32)
    rel = ((back - x).abs() / x.abs().amax(dim=-1, keepdim=True)).amax()
    assert rel < 2 ** -4  # e4m3: 3 mantissa bits, relative to the head's largest value
    assert torch.allclose(back.abs().amax(dim=-1), x.abs().amax(dim=-1), rtol=1e-6)  # the largest value kept


def test_fp8_pool_stores_and_gathers_dequantised_values():
    pool = KVPool(2, 8, 2, 2, 16, torch.float32, torch.device("cpu"), fp8=True)
    k, v = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    loc = torch.tensor([5, 0, 9])
    pool.store(1, loc, k, v)
    assert pool.k.dtype == FP8_DTYPE and pool.k_scale.shape == (2, 16, 2)
    got_k, got_v = pool.gather(1, torch.tensor([9, 5]), torch.float32)
    assert torch.allclose(got_k, k[[2, 0]], rtol=0.07, atol=0.07 * k.abs().max().item())
    assert torch.allclose(got_v, v[[2, 0]], rtol=0.07, atol=0.07 * v.abs().max().item())
    assert not pool.gather(0, torch.tensor([5]), torch.float32)[0].any()  # other layers untouched
    assert KVPool.bytes_per_token(28, 8, 128, torch.bfloat16, fp8=True) * 2 < \
        KVPool.bytes_per_token(28, 8, 128, torch.bfloat16) * 1.1


def test_fp8_greedy_decode_matches_the_float_cache_on_a_random_model():
    from core import LLM, SamplingParams

    prompts = [[5, 17, 200, 33, 90, 1, 2], [300, 4, 4, 4, 8], list(range(40, 70))]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    exact = [o["token_ids"] for o in LLM("random:tiny-qwen3", device="cpu").generate(prompts, params)]
    fp8 = [o["token_ids"] for o in LLM("random:tiny-qwen3", device="cpu", kv_dtype="fp8",
                                       page_size=4).generate(prompts, params)]
    # random weights make no near-ties likely at this size: the first tokens agree
    assert [t[:2] for t in fp8] == [t[:2] for t in exact]


@pytest.mark.parametrize("kwargs, message", [
    ({"kv_dtype": "int4"}, "unknown kv_dtype 'int4'; use one of auto, fp8"),
])
def test_bad_kv_dtype_is_a_clear_error(kwargs, message):
    with pytest.raises(InvalidParamsError, match=message):
        EngineConfig(**kwargs)


def test_cli_rejects_an_unknown_kv_dtype_in_one_line():
    from typer.testing import CliRunner

    from minisgl_cli.app import app

    result = CliRunner().invoke(app, ["generate", "-", "--kv-dtype", "int4"], input="hi\n")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "int4" in result.output
