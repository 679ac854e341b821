"""``precision``: 'exact' keeps float32 (a single request's decode steps in C where the CPU has AVX2 and FMA);
'fast' picks int8 weights for that C step and, with AMX, bf16 copies of the linears for prefill and batches (or
keeps float32 and names what it lacks); 'int8' quantises anyway."""

from __future__ import annotations

import json

import pytest
import torch

from core import LLM
from core.config import EngineConfig
from core.engine.plan import plan_engine
from core.errors import InvalidParamsError
from core.kernels.cpu import decode as cpu_decode, gemm as cpu_gemm
from core.kernels.cpu import features as features_module
from core.kernels.cpu.bf16_weights import Bf16Weight, bf16_copy
from core.kernels.cpu.int8_weights import INT8_MM_MAX_ROWS, Int8Weight, int8_linear
from core.kernels.cpu.onednn_packed import PACKED_MAX_ROWS
from core.bench.reference import HFReference, compare
from core.request import SamplingParams
from tests.support.cli import assert_user_error, run, write

CPU = torch.device("cpu")
C_DECODE_REASON = (cpu_decode.unsupported_reason(features_module.cpu_features().flags)
                   or cpu_decode.load_library().reason)
C_GEMM_BUILDS = not cpu_gemm.load_library().reason  # the C GEMM's flags are faked below; its build is real


@pytest.fixture
def cpu_like(monkeypatch):
    """Make the machine look like a CPU with torch capability ``capability`` and these /proc/cpuinfo flags."""
    def pretend(capability: str, *flags: str) -> None:
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        monkeypatch.setattr(features_module, "_cpuinfo_flags", lambda: frozenset(flags))
        features_module.cpu_features.cache_clear()

    yield pretend
    features_module.cpu_features.cache_clear()


def against_transformers(model_dir, outputs: list[dict], ids: list[list[int]], max_tokens: int) -> list:
    """Each output's verdict against transformers' greedy tokens for the same prompt ids."""
    reference = HFReference(model_dir)
    return [compare(o["token_ids"], o["finish_reason"], reference.greedy(i, max_tokens, ignore_eos=True), ())
            for o, i in zip(outputs, ids)]


def fast(dtype: str | None = None, precision: str = "fast"):
    return plan_engine(EngineConfig(precision=precision, dtype=dtype), CPU, torch.float32)


def test_exact_is_the_default_and_keeps_float32():
    plan = plan_engine(EngineConfig(), CPU, torch.float32)
    assert plan.precision.dtype == torch.float32 and not plan.kernels.int8_weights and plan.precision.note == ""
    assert not plan.precision.c_int8 and plan.precision.c_decode == (not C_DECODE_REASON)


def test_exact_runs_the_c_step_only_where_the_cpu_has_avx2_and_fma(cpu_like, monkeypatch):
    cpu_like("AVX2", "avx", "avx2")
    assert not fast(precision="exact").precision.c_decode
    assert not plan_engine(EngineConfig(), torch.device("meta"), torch.float32).precision.c_decode
    if not C_DECODE_REASON:
        cpu_like("AVX512", "avx", "avx2", "fma", "avx512f")
        assert fast(precision="exact").precision.c_decode
        assert not plan_engine(EngineConfig(kv_dtype="fp8"), CPU, torch.float32).precision.c_decode
        monkeypatch.setenv("MINISGL_DISABLE_CPU_DECODE", "1")
        assert not fast(precision="exact").precision.c_decode


def test_fast_where_the_c_step_cannot_run_keeps_float32_even_with_avx512(cpu_like):
    cpu_like("AVX512", "avx2", "avx512f", "avx512_bf16")  # no FMA: no C step; AVX512-BF16 alone: no bf16
    plan = fast()
    assert not plan.kernels.int8_weights and plan.precision.dtype == torch.float32 and not plan.precision.c_decode
    note = plan.precision.note
    assert note.startswith("precision fast: kept exact float32: the int8 decode step does not run in C (this CPU "
                           "lacks FMA for the C decode step)")
    assert "lacks AMX-BF16 for bf16 (AVX512-BF16 alone measured slower than float32)" in note and "\n" not in note


def test_fast_on_an_avx2_cpu_without_fma_keeps_float32_and_names_what_it_lacks(cpu_like):
    cpu_like("AVX2", "avx", "avx2")
    plan = fast()
    assert not plan.kernels.int8_weights and plan.precision.dtype == torch.float32 and not plan.precision.c_decode
    assert "lacks FMA for the C decode step" in plan.precision.note
    assert "this CPU lacks AMX-BF16 for bf16, and" in plan.precision.note and "\n" not in plan.precision.note


@pytest.mark.skipif(bool(C_DECODE_REASON), reason=C_DECODE_REASON or "the C decode step builds here")
@pytest.mark.parametrize("capability, flags", [("AVX2", ("avx", "avx2", "fma")),
                                               ("AVX512", ("avx", "avx2", "fma", "avx512f", "avx512_bf16")),
                                               ("AVX512", ("avx", "avx2", "fma", "avx512f", "amx_bf16"))])
def test_fast_where_the_c_step_runs_is_the_int8_step_with_float32_or_amx_batches(cpu_like, capability, flags):
    cpu_like(capability, *flags)
    plan = fast()
    assert plan.precision.dtype == torch.float32 and not plan.kernels.int8_weights
    assert plan.precision.c_decode and plan.precision.c_int8 and plan.precision.int8_dots
    amx = "amx_bf16" in flags  # with AMX, prefill and batches on bf16 copies of the linears; else float32
    # float32 linears on the C GEMM's panels with AVX-512 (where it builds), else on oneDNN's packing
    assert plan.kernels.c_gemm == ("avx512f" in flags and not amx and C_GEMM_BUILDS)
    assert plan.kernels.packed_weights == (not plan.kernels.c_gemm)
    assert plan.precision.bf16_linears == plan.kernels.bf16_linears == amx
    int8_note = fast(precision="int8").precision.note.removeprefix("precision int8: ")
    if amx:
        head, _, batches = int8_note.partition("; prefill and batches of more requests on ")
        assert plan.precision.note == (f"precision fast: {head}; prefill and batches of more requests on bf16 copies "
                                       f"of the linears and the LM head through AMX-BF16 (activations, attention "
                                       f"and the KV cache float32)")
        assert batches.startswith("the float32 weights")  # int8 keeps float32 batches, AMX or not
    else:
        assert plan.precision.note == "precision fast: " + int8_note
    assert not plan_engine(EngineConfig(precision="fast", kv_dtype="fp8"), CPU, torch.float32).precision.c_decode


@pytest.mark.skipif(bool(C_DECODE_REASON), reason=C_DECODE_REASON or "the C decode step builds here")
def test_exact_with_the_c_decode_step_gives_transformers_tokens_on_the_embedded_model(smollm2_dir):
    prompts = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of"]
    with LLM(smollm2_dir, max_running_req=4) as llm:
        assert llm.engine.cpu_paths.decode_step is not None and "decode steps in C" in llm.engine.describe()
        assert llm.precision_note == ""
        ids = [llm.tokenizer.encode(p) for p in prompts]
        params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
        outputs = [llm.generate([p], params)[0] for p in prompts]  # one at a time: every decode step in C
    verdicts = against_transformers(smollm2_dir, outputs, ids, 12)
    assert [v.status for v in verdicts] == ["match"] * 3 and all(v.exact for v in verdicts)


def test_fast_with_amx_runs_bf16_linears_where_the_c_step_cannot(cpu_like):
    cpu_like("AVX512", "avx512f", "amx_bf16", "amx_tile")  # no AVX2 and FMA flags: no C step
    for dtype in (None, "float32"):
        plan = fast(dtype)
        assert plan.precision.dtype == torch.float32 and plan.kernels.bf16_linears and not plan.precision.c_decode
        assert plan.precision.note.startswith("precision fast: every step on bf16 copies of the linears and the LM "
                                              "head through AMX-BF16")
        assert plan.precision.note.endswith("not in C: this CPU lacks AVX2 and FMA for the C decode step")


@pytest.mark.parametrize("rows", [1, 5, PACKED_MAX_ROWS, PACKED_MAX_ROWS + 3])  # packed and plain bf16 products
def test_bf16_linear_is_float32_within_bf16_rounding(rows):
    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(96, 160, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(rows, 160, generator=gen)
    copy = bf16_copy(weight)
    assert copy.weight.dtype == torch.bfloat16 and copy.weight.shape == weight.shape
    out = copy.linear(x, bias)
    assert out.dtype == torch.float32 and out.shape == (rows, 96)
    # the products of the rounded inputs and weights, summed in float32 and the sum rounded to bf16 ...
    rounded = x.bfloat16().float() @ copy.weight.float().T
    torch.testing.assert_close(out - bias, rounded, rtol=2.0 ** -7, atol=1e-3)
    # ... so within bf16's rounding (2^-8 relative: of each input, each weight and the sum) of float32's
    bound = 3 * 2.0 ** -8 * (x.abs() @ weight.abs().T) + 1e-3
    error = (out - (x @ weight.T + bias)).abs()
    assert bool((error <= bound).all()) and float(error.max()) > 0  # and it did round


def test_fast_with_amx_runs_batches_on_bf16_linears_with_no_differences_against_transformers(smollm2_dir,
                                                                                             cpu_like):
    cpu_like("AVX512", "avx", "avx2", "fma", "avx512f", "amx_bf16")  # bf16 runs without AMX too, only slower
    prompts = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of"]
    with LLM(smollm2_dir, precision="fast", max_running_req=4) as llm:
        engine = llm.engine
        # qkv, o, gate_up, down; the LM head
        assert engine.cpu_paths.bf16_linears == 4 * engine.model_config.num_layers + 1
        assert isinstance(engine.model.lm_head.packed, Bf16Weight)
        layer = engine.model.model.layers[0].mlp.down_proj
        assert isinstance(layer.packed, Bf16Weight)  # the kernels table runs the form in the slot
        assert layer.weight.dtype == torch.float32 and engine.kv_pool.dtype == torch.float32
        assert "bf16 linears (AMX) for prefill and batches" in engine.describe()
        outputs = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))  # batched
        ids = [llm.tokenizer.encode(p) for p in prompts]
    verdicts = against_transformers(smollm2_dir, outputs, ids, 8)
    assert [v.status for v in verdicts if v.status not in ("match", "near-tie")] == []
    assert sum(v.exact for v in verdicts) >= 2  # a near-tie at most: bf16 products, not a different model


def test_int8_is_for_float32_on_a_cpu_and_unknown_precisions_are_refused():
    plan = fast(precision="int8")
    assert plan.kernels.int8_weights or plan.precision.c_int8
    with pytest.raises(InvalidParamsError, match="precision 'int8' runs float32 activations on a CPU"):
        plan_engine(EngineConfig(precision="int8"), CPU, torch.bfloat16)
    with pytest.raises(InvalidParamsError, match="unknown precision 'turbo'; use one of exact, fast, int8"):
        EngineConfig(precision="turbo")


@pytest.mark.skipif(bool(C_DECODE_REASON), reason=C_DECODE_REASON or "the C decode step builds here")
def test_int8_runs_single_request_decode_in_c_where_the_cpu_has_avx2_and_fma(cpu_like, monkeypatch):
    cpu_like("AVX2", "avx", "avx2", "fma")  # torch's int8 kernel is slow here: prefill and batches on float32
    plan = fast(precision="int8")
    assert not plan.kernels.int8_weights and plan.kernels.packed_weights and not plan.kernels.c_gemm
    assert plan.precision.c_decode and plan.precision.c_int8 and plan.precision.int8_dots
    assert plan.precision.note.startswith("precision int8: one request's decode steps in C (AVX2 and FMA) on int8 "
                                          "weights with a scale per row (decoder linears and LM head) and int8 "
                                          "inputs (integer dot products); prefill and batches of more requests "
                                          "on the float32 weights")
    assert plan.precision.words == "single-request decode steps in C on int8 weights"
    cpu_like("AVX512", "avx", "avx2", "fma", "avx512f")  # torch's int8 kernel is slow for batches here too
    plan = fast(precision="int8")
    assert not plan.kernels.int8_weights and plan.precision.c_decode and plan.precision.c_int8
    monkeypatch.setenv("MINISGL_DISABLE_INT8_DOTS", "1")
    plan = fast(precision="int8")
    assert not plan.precision.int8_dots and "(decoder linears and LM head) and float32 inputs;" in plan.precision.note
    cpu_like("AVX2", "avx", "avx2")
    plan = fast(precision="int8")
    assert plan.kernels.int8_weights and not plan.precision.c_decode and not plan.precision.c_int8
    assert "decode steps not in C: this CPU lacks FMA for the C decode step" in plan.precision.note
    assert "\n" not in plan.precision.note


@pytest.mark.skipif(bool(C_DECODE_REASON), reason=C_DECODE_REASON or "the C decode step builds here")
def test_int8_with_the_c_decode_step_has_no_differences_against_transformers(smollm2_dir):
    prompts = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of"]
    with LLM(smollm2_dir, precision="int8", max_running_req=4) as llm:
        engine = llm.engine
        step = engine.cpu_paths.decode_step
        assert step is not None and isinstance(step.lm_head, Int8Weight)
        # the torch layers keep float32 for prefill and batches; the C step reads int8 copies
        assert engine.cpu_paths.int8_linears == 0 and engine.cpu_paths.packed_linears > 0
        assert "decode steps in C on int8 weights" in engine.describe()
        layer = engine.model.model.layers[0].mlp.down_proj
        copy, expected = step.layers_kept[0].down, Int8Weight.quantize(layer.weight)
        if engine.plan.precision.int8_dots:  # the step reads it tiled (core/kernels/cpu/decode.c's tile_int8)
            expected = cpu_decode.tiled(cpu_decode.load_library().library, expected)
        assert torch.equal(copy.values, expected.values)
        params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
        outputs = [llm.generate([p], params)[0] for p in prompts]  # one at a time: every decode step in C
        ids = [llm.tokenizer.encode(p) for p in prompts]
    verdicts = against_transformers(smollm2_dir, outputs, ids, 12)
    assert [v.status for v in verdicts if v.status not in ("match", "near-tie")] == []
    assert sum(v.exact for v in verdicts) >= 2


@pytest.mark.parametrize("rows", [1, 7, INT8_MM_MAX_ROWS, INT8_MM_MAX_ROWS + 5])  # both paths of int8_linear
def test_int8_linear_is_within_half_a_scale_per_weight_of_float(rows):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 160, generator=gen) * torch.rand(96, 1, generator=gen)  # rows of varied range
    x, bias = torch.randn(rows, 160, generator=gen), torch.randn(96, generator=gen)
    q = Int8Weight.quantize(weight)
    assert q.values.dtype == torch.int8 and int(q.values.abs().max()) == 127 and q.scales.shape == (96,)
    out = int8_linear(x, q, bias)
    # the kernel multiplies by exactly the dequantised weight (float32 rounding aside) ...
    torch.testing.assert_close(out, x @ q.dequantize().T + bias, rtol=1e-5, atol=1e-4)
    # ... which is within half a scale of each float weight, so each output within sum|x| * scale / 2
    error = (out - (x @ weight.T + bias)).abs()
    bound = x.abs().sum(1, keepdim=True) * q.scales / 2
    assert bool((error <= bound + 1e-4).all())
    assert float(error.mean() / (x @ weight.T).abs().mean()) < 0.01


def test_int8_end_to_end_on_the_embedded_model_has_no_differences_against_transformers(smollm2_dir, cpu_like):
    cpu_like("AVX512", "avx2", "avx512f")  # where torch's int8 kernel is vectorised: the torch layers are int8
    prompts = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of"]
    with LLM(smollm2_dir, precision="int8", max_running_req=4) as llm:
        engine = llm.engine
        assert engine.cpu_paths.int8_linears == 4 * engine.model_config.num_layers  # qkv, o, gate_up, down per layer
        assert isinstance(engine.model.model.layers[0].mlp.down_proj.packed, Int8Weight)
        assert "int8 weight-only linears" in engine.describe()
        outputs = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
        ids = [llm.tokenizer.encode(p) for p in prompts]
    verdicts = against_transformers(smollm2_dir, outputs, ids, 8)
    assert [v.status for v in verdicts if v.status not in ("match", "near-tie")] == []
    assert sum(v.exact for v in verdicts) >= 2  # a near-tie at most: int8 weights, not a different model


def test_the_cli_refuses_a_bad_precision_in_one_line(tmp_path):
    prompts = write(tmp_path / "p.txt", "hello\n")
    for command in ("generate", "verify", "trace"):
        assert_user_error(run(command, prompts, "--precision", "turbo"),
                          "'turbo' is not one of 'exact', 'fast', 'int8'")
    assert_user_error(run("bench", "--precision", "half"), "'half' is not one of 'exact', 'fast', 'int8'")


def test_fast_says_on_stderr_which_instructions_it_lacks(cpu_like, tmp_path):
    cpu_like("AVX2", "avx2")
    result = run("generate", write(tmp_path / "p.txt", "hi\n"), "--model", "random:tiny-qwen3", "-n", "2",
                 "--precision", "fast")
    assert result.exit_code == 0, result.stderr
    [line] = [ln for ln in result.stderr.splitlines() if ln.startswith("precision fast")]
    assert "lacks FMA for the C decode step" in line and "lacks AMX-BF16 for bf16" in line
    with LLM("random:tiny-qwen3", precision="fast") as llm:
        assert llm.precision_note == line


def test_bench_runs_the_exact_engine_beside_the_fast_one():
    result = run("bench", "--model", "random:tiny-qwen3", "--requests", "2", "--json", "--threads", "1",
                 "--skip-baselines", "--precision", "int8")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert [r["name"] for r in report["results"]] == ["minisgl", "minisgl exact"]
    assert report["results"][0]["output_tokens"] == report["results"][1]["output_tokens"]
    assert report["precision"] == "int8" and report["precision_note"].startswith("precision int8")
    assert report["batch1_ms_per_token"] > 0 and report["exact_batch1_ms_per_token"] > 0
