"""Every switch is decided once into the engine's plan, and the layers, the backend and the description follow it."""

from __future__ import annotations

import pytest
import torch

from core import LLM
from core.config import EngineConfig
from core.engine import plan as plan_module
from core.kernels.cuda import plan as cuda_plan
from core.engine.plan import kernel_choices, plan_engine
from core.errors import InvalidParamsError
from core.kernels.choices import KernelChoices
from core.kernels.cpu.features import cpu_features
from core.kernels.dispatch import FlashInferKernels, TorchKernels, kernels_for

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
SWITCHES = ("MINISGL_DISABLE_FUSED_QKV", "MINISGL_DISABLE_GEMV", "MINISGL_DISABLE_SMALL_DECODE",
            "MINISGL_DISABLE_CPU_WEIGHT_PACKING", "MINISGL_DISABLE_OVERLAP_SCHEDULING", "MINISGL_DISABLE_PDL",
            "MINISGL_DISABLE_TRITON_SAMPLER", "MINISGL_DISABLE_CUDA_FP8_DECODE", "MINISGL_DISABLE_SCREENED_HEAD",
            "MINISGL_DISABLE_PREFILL_GRAPH", "MINISGL_DISABLE_HEAD_MAJOR_KV", "MINISGL_DISABLE_CPU_DECODE")


@pytest.fixture
def triton_everywhere(monkeypatch):
    """Decide as on a machine where the Triton kernels run, with no switch set."""
    for name in SWITCHES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(plan_module, "triton_runs_on", lambda device: True)
    monkeypatch.setattr(plan_module, "dependent_launch_runs_on", lambda device: device.type == "cuda")
    monkeypatch.setattr(cuda_plan, "fp8_cuda_unavailable", lambda device: "no nvcc (this test's machine)")


def test_flashinfer_takes_every_triton_kernel_unless_switched_off(triton_everywhere, monkeypatch):
    assert kernel_choices("flashinfer", CUDA, torch.bfloat16) == KernelChoices(
        flashinfer=True, fused_qkv=True, gemv=True, small_decode=True, pdl=True, triton_sampler=True,
        packed_weights=False, gpu_screened_head=True, split_k=2)
    monkeypatch.setenv("MINISGL_SPLIT_K", "0")
    assert kernel_choices("flashinfer", CUDA, torch.bfloat16).split_k == 0
    monkeypatch.delenv("MINISGL_SPLIT_K")
    assert kernel_choices("torch", CUDA, torch.bfloat16).split_k == 0  # the partials' norm is a Triton kernel
    monkeypatch.setenv("MINISGL_DISABLE_SCREENED_HEAD", "1")
    assert not kernel_choices("flashinfer", CUDA, torch.bfloat16).gpu_screened_head
    monkeypatch.delenv("MINISGL_DISABLE_SCREENED_HEAD")
    monkeypatch.setenv("MINISGL_DISABLE_PDL", "1")
    assert not kernel_choices("flashinfer", CUDA, torch.bfloat16).pdl
    monkeypatch.delenv("MINISGL_DISABLE_PDL")
    monkeypatch.setenv("MINISGL_DISABLE_GEMV", "1")
    assert not kernel_choices("flashinfer", CUDA, torch.bfloat16).gemv
    assert not kernel_choices("flashinfer", CUDA, torch.bfloat16).gpu_screened_head  # its kept logits are GEMVs
    monkeypatch.setenv("MINISGL_DISABLE_FUSED_QKV", "1")
    # the small-batch decode starts from the fused QKV path: off with it, so the graphs and the layers agree
    choices = kernel_choices("flashinfer", CUDA, torch.bfloat16)
    assert not choices.fused_qkv and not choices.small_decode


def test_an_fp8_pool_under_flashinfer_reads_its_prefill_sequences_through_the_triton_gather(triton_everywhere):
    assert kernel_choices("flashinfer", CUDA, torch.bfloat16, kv_fp8=True).fp8_gather
    assert not kernel_choices("flashinfer", CUDA, torch.bfloat16).fp8_gather
    assert not kernel_choices("torch", CUDA, torch.bfloat16, kv_fp8=True).fp8_gather


def test_the_triton_sampler_runs_beside_flashinfers_kernels_unless_disabled(triton_everywhere, monkeypatch):
    assert kernel_choices("flashinfer", CUDA, torch.bfloat16).triton_sampler
    monkeypatch.setenv("MINISGL_DISABLE_TRITON_SAMPLER", "1")
    assert not kernel_choices("flashinfer", CUDA, torch.bfloat16).triton_sampler
    assert kernel_choices("torch", CUDA, torch.bfloat16) == KernelChoices()  # the plain-torch reference stays so


def test_torch_attention_runs_torch_kernels_and_no_triton_kernel(triton_everywhere):
    choices = kernel_choices("torch", CUDA, torch.bfloat16)
    assert choices == KernelChoices()
    assert kernels_for(choices) == TorchKernels() and not kernels_for(choices).fuses_qkv


def test_the_kernel_table_carries_the_choices():
    table = kernels_for(KernelChoices(flashinfer=True, fused_qkv=True, gemv=False))
    assert isinstance(table, FlashInferKernels) and table.fuses_qkv and not table.gemv
    with pytest.raises(ValueError):
        KernelChoices(flashinfer=True, small_decode=True)  # no small decode without the fused QKV path
    with pytest.raises(ValueError):
        KernelChoices(flashinfer=True, pdl=True)  # dependent launches are for the GEMV and small decode kernels
    table = kernels_for(KernelChoices(flashinfer=True, fused_qkv=True, gemv=True, pdl=True))
    assert table.gemv and table.pdl


def test_dependent_launches_only_where_the_gpu_has_them(triton_everywhere, monkeypatch):
    monkeypatch.setattr(plan_module, "dependent_launch_runs_on", lambda device: False)  # before Hopper
    choices = kernel_choices("flashinfer", CUDA, torch.bfloat16)
    assert choices.gemv and not choices.pdl


def test_cpu_plan_and_the_switches_that_change_it(triton_everywhere, monkeypatch):
    plan = plan_engine(EngineConfig(), CPU, torch.float32)
    assert (plan.attention, plan.cuda_graph_max_bs, plan.overlap, plan.fp8_paged_decode) == ("torch", 0, False, False)
    c_gemm = not plan_module.c_gemm_unavailable(CPU, torch.float32, cpu_features())  # AVX-512 and it builds
    assert plan.kernels.c_gemm == c_gemm and not plan_engine(EngineConfig(), CPU, torch.bfloat16).kernels.c_gemm
    assert plan.kernels.packed_weights == (torch.backends.mkldnn.is_available() and not c_gemm)
    monkeypatch.setenv("MINISGL_DISABLE_CPU_GEMM", "1")
    kernels = plan_engine(EngineConfig(), CPU, torch.float32).kernels
    assert not kernels.c_gemm and kernels.packed_weights == torch.backends.mkldnn.is_available()
    monkeypatch.setenv("MINISGL_DISABLE_CPU_WEIGHT_PACKING", "1")
    assert not plan_engine(EngineConfig(), CPU, torch.float32).kernels.packed_weights
    assert plan_engine(EngineConfig(overlap=True), CPU, torch.float32).overlap
    monkeypatch.setenv("MINISGL_DISABLE_OVERLAP_SCHEDULING", "1")
    assert not plan_engine(EngineConfig(overlap=True), CPU, torch.float32).overlap


def test_one_row_goes_packed_only_with_more_than_one_thread(monkeypatch):
    """The BLAS's matrix-vector product runs on one thread, oneDNN's packed GEMM on all of them."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN in this torch build")
    monkeypatch.setenv("MINISGL_DISABLE_CPU_GEMM", "1")  # oneDNN's packing is what a CPU without AVX-512 gets
    assert not plan_engine(EngineConfig(threads=1), CPU, torch.float32).kernels.packed_one_row
    assert plan_engine(EngineConfig(threads=3), CPU, torch.float32).threads == 3  # what the engine sets torch to
    choices = plan_engine(EngineConfig(threads=2), CPU, torch.float32).kernels
    assert choices.packed_weights and choices.packed_one_row and kernels_for(choices).packed_one_row
    with pytest.raises(ValueError):
        KernelChoices(packed_one_row=True)  # nothing to run one row on without packed weights


def test_the_engine_builds_from_its_plan(monkeypatch):
    monkeypatch.setenv("MINISGL_DISABLE_CPU_WEIGHT_PACKING", "1")
    monkeypatch.setenv("MINISGL_DISABLE_CPU_GEMM", "1")
    engine = LLM("random:tiny-qwen3", max_running_req=2, device="cpu", dtype="float32").engine
    monkeypatch.delenv("MINISGL_DISABLE_CPU_WEIGHT_PACKING")  # decided at build: changing it later changes nothing
    monkeypatch.delenv("MINISGL_DISABLE_CPU_GEMM")
    assert not engine.plan.kernels.packed_weights and not engine.plan.kernels.c_gemm and engine.cpu_paths.packed_linears == 0
    assert all(layer.packed is None for layer in engine.model.modules() if hasattr(layer, "packed"))
    assert {type(m.kernels) for m in engine.model.modules() if hasattr(m, "kernels")} == {TorchKernels}
    assert "torch attention with torch kernels" in engine.describe() and "no CUDA graphs" in engine.describe()


def test_an_fp8_kv_cache_on_cuda_takes_flashinfer_with_graphs_but_not_the_small_decode(triton_everywhere,
                                                                                       monkeypatch):
    """The flashinfer backend decodes fp8 pages with the Triton paged kernel, so an fp8 cache keeps the fused
    QKV path and CUDA graphs; the small-batch decode kernel reads bf16 pages, so it is off."""
    monkeypatch.setattr(plan_module, "flashinfer_available", lambda: True)
    plan = plan_engine(EngineConfig(kv_dtype="fp8"), CUDA, torch.bfloat16)
    assert (plan.attention, plan.kv_fp8, plan.fp8_paged_decode) == ("flashinfer", True, False)
    assert plan.kernels.fused_qkv and not plan.kernels.small_decode and plan.cuda_graph_max_bs > 0
    assert plan_engine(EngineConfig(), CUDA, torch.bfloat16).kernels.small_decode
    torch_plan = plan_engine(EngineConfig(kv_dtype="fp8", attention="torch"), CUDA, torch.bfloat16)
    assert (torch_plan.attention, torch_plan.fp8_paged_decode, torch_plan.cuda_graph_max_bs) == ("torch", True, 0)
    monkeypatch.setattr(plan_module, "triton_runs_on", lambda device: False)  # no Triton: no fp8 paged decode
    assert plan_engine(EngineConfig(kv_dtype="fp8"), CUDA, torch.bfloat16).attention == "torch"
    with pytest.raises(InvalidParamsError, match="Triton"):
        plan_engine(EngineConfig(kv_dtype="fp8", attention="flashinfer"), CUDA, torch.bfloat16)


def test_an_fp8_cache_under_flashinfer_decodes_on_the_cuda_kernel_where_it_builds(triton_everywhere, monkeypatch):
    """Only an fp8 pool under flashinfer attention, only where the kernel builds for the GPU, and not with
    MINISGL_DISABLE_CUDA_FP8_DECODE=1 (the Triton paged kernel then); the engine's description names it."""
    from core.engine.describe import kernel_words

    monkeypatch.setattr(plan_module, "flashinfer_available", lambda: True)
    assert not plan_engine(EngineConfig(kv_dtype="fp8"), CUDA, torch.bfloat16).fp8_cuda_decode  # did not build
    monkeypatch.setattr(cuda_plan, "fp8_cuda_unavailable", lambda device: "")
    plan = plan_engine(EngineConfig(kv_dtype="fp8"), CUDA, torch.bfloat16)
    assert plan.fp8_cuda_decode and "CUDA fp8 decode" in kernel_words(plan)
    assert not plan_engine(EngineConfig(), CUDA, torch.bfloat16).fp8_cuda_decode  # a bf16 pool
    assert not plan_engine(EngineConfig(kv_dtype="fp8", attention="torch"), CUDA, torch.bfloat16).fp8_cuda_decode
    monkeypatch.setenv("MINISGL_DISABLE_CUDA_FP8_DECODE", "1")
    assert not plan_engine(EngineConfig(kv_dtype="fp8"), CUDA, torch.bfloat16).fp8_cuda_decode


def test_flashinfer_only_for_the_head_dims_its_kernels_are_built_for(triton_everywhere, monkeypatch):
    """A model of head dim 16 (a tiny test shape) runs torch attention on CUDA by default; asked for flashinfer, it
    is a clear error before anything loads, not a kernel build that fails in the first prefill."""
    from core.engine.plan import AttentionShape

    monkeypatch.setattr(plan_module, "flashinfer_available", lambda: True)
    for head_dim in (64, 128, 256):
        heads = AttentionShape(8, 4, head_dim)
        assert plan_engine(EngineConfig(), CUDA, torch.bfloat16, heads).attention == "flashinfer"
    odd = AttentionShape(4, 2, 16)
    assert plan_engine(EngineConfig(), CUDA, torch.bfloat16, odd).attention == "torch"
    with pytest.raises(InvalidParamsError, match="head dims 64, 128, 256; this model's is 16: use --attention torch"):
        plan_engine(EngineConfig(attention="flashinfer"), CUDA, torch.bfloat16, odd)


def test_the_plan_decides_from_the_models_heads(triton_everywhere, monkeypatch):
    """Given one rank's heads, the plan takes the CUDA fp8 decode only where that kernel takes them (the backend
    never checks again, so the description names what runs), and tensor cores at every decode size for 4+ query
    heads per KV head, whatever MINISGL_TENSOR_CORE_DECODE_ROWS asks."""
    from core.engine.plan import AttentionShape

    monkeypatch.setattr(plan_module, "flashinfer_available", lambda: True)
    monkeypatch.setattr(cuda_plan, "fp8_cuda_unavailable", lambda device: "")
    fp8 = EngineConfig(kv_dtype="fp8")
    assert plan_engine(fp8, CUDA, torch.bfloat16, AttentionShape(16, 8, 128)).fp8_cuda_decode
    for heads in (AttentionShape(16, 8, 256), AttentionShape(64, 4, 128)):  # a head dim, a group it does not take
        assert not plan_engine(fp8, CUDA, torch.bfloat16, heads).fp8_cuda_decode, heads
    monkeypatch.setenv("MINISGL_TENSOR_CORE_DECODE_ROWS", "0")
    assert plan_engine(EngineConfig(), CUDA, torch.bfloat16, AttentionShape(16, 8, 128)).tensor_core_decode_rows == 0
    assert plan_engine(EngineConfig(), CUDA, torch.bfloat16, AttentionShape(32, 8, 128)).tensor_core_decode_rows == 1
    assert plan_engine(fp8, CUDA, torch.bfloat16, AttentionShape(32, 8, 128)).tensor_core_decode_rows == 0


def test_full_prefill_chunks_run_under_a_graph_only_beside_decode_graphs_on_one_rank(triton_everywhere, monkeypatch):
    """A bf16 pool under flashinfer attention with decode graphs, on one rank: not with graphs off, an fp8 pool
    (its prefill is a ragged plan), tensor parallelism, the torch backend, a CPU, or the switch."""
    monkeypatch.setattr(plan_module, "flashinfer_available", lambda: True)
    assert plan_engine(EngineConfig(), CUDA, torch.bfloat16).prefill_graph
    for config in (EngineConfig(cuda_graph_max_bs=0), EngineConfig(kv_dtype="fp8"), EngineConfig(tp=2),
                   EngineConfig(attention="torch", cuda_graph_max_bs=0)):
        assert not plan_engine(config, CUDA, torch.bfloat16).prefill_graph, config
    assert not plan_engine(EngineConfig(), CPU, torch.float32).prefill_graph
    monkeypatch.setenv("MINISGL_DISABLE_PREFILL_GRAPH", "1")
    assert not plan_engine(EngineConfig(), CUDA, torch.bfloat16).prefill_graph


def test_the_pool_is_head_major_only_where_every_reader_takes_it(triton_everywhere, monkeypatch):
    """flashinfer attention on a bf16 pool: head-major; an fp8 pool, the torch backend, or a CPU engine whose
    single-request steps run the C decode (token-major rows) keep it token-major, and so does the switch."""
    monkeypatch.setattr(plan_module, "flashinfer_available", lambda: True)
    assert plan_engine(EngineConfig(), CUDA, torch.bfloat16).head_major_kv
    for config in (EngineConfig(kv_dtype="fp8"), EngineConfig(attention="torch", cuda_graph_max_bs=0)):
        assert not plan_engine(config, CUDA, torch.bfloat16).head_major_kv, config
    cpu_flashinfer = EngineConfig(attention="flashinfer")
    c_decode = plan_engine(cpu_flashinfer, CPU, torch.float32)
    assert c_decode.head_major_kv == (not c_decode.precision.c_decode)
    monkeypatch.setenv("MINISGL_DISABLE_CPU_DECODE", "1")
    assert plan_engine(cpu_flashinfer, CPU, torch.float32).head_major_kv
    monkeypatch.setenv("MINISGL_DISABLE_HEAD_MAJOR_KV", "1")
    assert not plan_engine(EngineConfig(), CUDA, torch.bfloat16).head_major_kv
