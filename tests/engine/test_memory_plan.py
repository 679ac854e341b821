"""The card's memory planned once (core/engine/kv_budget.py, core/kernels/cuda/footprint.py): the KV pool is sized
after what the CUDA wing keeps once it is installed, so a model that fits the card starts on it. The arithmetic is
checked here on a CPU, with the free memory an 80 GB card has once the Qwen3-8B shape is loaded."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from core.bench.flops import body_params
from core.config import EngineConfig
from core.engine.describe import budget_words
from core.engine.kv_budget import GIB, plan_memory, pool_pages
from core.kernels.choices import KernelChoices
from core.kernels.cpu.int8_weights import QUANTIZE_BLOCK_ELEMENTS, Int8Weight
from core.kernels.cuda.footprint import activation_bytes, cuda_footprint
from core.kernels.cuda.screened_head import GpuScreenedHead
from core.kvcache.pool import KVPool
from core.models.random_spec import SPECS

QWEN3_8B = SPECS["qwen3-8b"].config
BF16 = torch.bfloat16


def cuda_plan(**changes) -> SimpleNamespace:
    """What the plan chooses on an H100 with flashinfer and Triton (the fields the CUDA wing reads)."""
    plan = dict(attention="flashinfer", kv_fp8=False, fp8_paged_decode=False, fp8_cuda_decode=False,
                kernels=KernelChoices(flashinfer=True, gemv=True, gpu_screened_head=True),
                tensor_core_decode_rows=1, whole_request_decode=True, cuda_graph_max_bs=256, prefill_graph=True)
    return SimpleNamespace(**{**plan, **changes})


def free_after_weights(cfg, card_gib: float = 79.1, context_gib: float = 0.6) -> int:
    """What an 80 GB card has free once the model's bf16 weights (embedding and head untied) are loaded."""
    weights = (body_params(cfg) + 2 * cfg.vocab_size * cfg.hidden_size) * BF16.itemsize
    return int((card_gib - context_gib) * GIB) - weights


def test_the_pool_and_everything_the_wing_keeps_fit_the_card_with_the_8b_shape():
    config = EngineConfig(max_running_req=256)  # what minisgl bench and the peer runs ask
    footprint = cuda_footprint(cuda_plan(), config, QWEN3_8B, BF16, max_seq_len=4096)
    vocab = QWEN3_8B.vocab_size
    assert footprint.screened_head == vocab * QWEN3_8B.hidden_size + 2 * 4 * vocab
    # six prefill graphs, each with the logits of 256 request rows in bf16 (~470 MB), beside the largest chunk's
    # activations
    assert footprint.prefill_graphs == 6 * 256 * vocab * 2 + activation_bytes(QWEN3_8B, 8192, BF16)
    free = free_after_weights(QWEN3_8B)
    memory = plan_memory(free, footprint.total)
    per_token = KVPool.bytes_per_token(QWEN3_8B.num_layers, QWEN3_8B.num_kv_heads, QWEN3_8B.head_dim, BF16, False)
    pages = pool_pages(config, per_token, 128, 4096, 1, torch.device("cpu"), memory)
    pool = pages * 128 * per_token
    assert pool + footprint.total + memory.reserve <= free
    assert pool > 40 * GIB  # the pool still takes most of the card
    # the screen's int8 copy is made a block of rows at a time: its float32 temporaries fit the reserve many times
    assert 3 * 4 * QUANTIZE_BLOCK_ELEMENTS < memory.reserve / 10
    assert budget_words(config, memory).startswith(f"the {memory.kv_bytes / GIB:.1f} GiB left of")


def test_the_screened_heads_count_is_what_it_allocates():
    weight = torch.randn(1000, 64, dtype=BF16)
    head = GpuScreenedHead.of(weight)
    kept = sum(t.numel() * t.element_size() for t in (head.values, head.scales, head.upper))
    cfg = SimpleNamespace(**{**vars(QWEN3_8B), "vocab_size": 1000, "hidden_size": 64})
    footprint = cuda_footprint(cuda_plan(), EngineConfig(), cfg, BF16, max_seq_len=512)
    assert footprint.screened_head == kept  # the best lower ends' 64 floats aside
    assert cuda_footprint(cuda_plan(), EngineConfig(), cfg, BF16, 512, tp=2).screened_head == 0  # one rank only


def test_nothing_is_counted_where_the_wing_installs_nothing():
    plain = cuda_plan(attention="torch", kernels=KernelChoices(), cuda_graph_max_bs=0, prefill_graph=False)
    assert cuda_footprint(plain, EngineConfig(), QWEN3_8B, BF16, 4096).total == 0
    graphs_off = cuda_footprint(cuda_plan(cuda_graph_max_bs=0, prefill_graph=False), EngineConfig(), QWEN3_8B, BF16,
                                4096)
    assert graphs_off.decode_graphs == graphs_off.prefill_graphs == 0 and graphs_off.workspace > 0


def test_an_asked_budget_or_page_count_wins_over_the_plan():
    memory = plan_memory(free=60 * GIB, counted=2 * GIB)
    assert memory.kv_bytes == 60 * GIB - 2 * GIB - 6 * GIB  # a tenth of the free memory kept back
    assert plan_memory(free=20 * GIB, counted=0).reserve == 4 * GIB  # at least 4 GiB
    cpu = torch.device("cpu")
    assert pool_pages(EngineConfig(kv_cache_gb=1.0), 1024, 1, 1 << 20, 1, cpu, memory) == GIB // 1024
    assert pool_pages(EngineConfig(num_pages=77), 1024, 1, 1 << 20, 1, cpu, memory) == 77
    assert budget_words(EngineConfig(kv_cache_gb=1.0), memory) == "the 1.0 GiB budget for the cache"


def test_quantizing_block_by_block_gives_the_whole_weights_codes():
    weight = torch.randn(300, 77, generator=torch.Generator().manual_seed(0)).to(BF16)
    whole = Int8Weight.quantize(weight, block_elements=300 * 77)
    blocks = Int8Weight.quantize(weight, block_elements=77 * 13 + 5)  # 13 rows a block, the last one short
    assert torch.equal(whole.values, blocks.values) and torch.equal(whole.scales, blocks.scales)
    assert whole.values.dtype == torch.int8 and whole.values.abs().max() == 127
