"""Which attention backend, kernels and graph mode the engine picks, and clear errors for impossible asks."""

from __future__ import annotations

import pytest
import torch

from core import LLM, InvalidParamsError
from core.attention.torch_backend import TorchAttentionBackend

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU defaults")


def test_cpu_defaults_to_torch_attention_and_kernels_without_graphs():
    llm = LLM("random:tiny-qwen3", max_running_req=2)
    engine = llm.engine
    # the torch backend, or the CPU wing's subclass of it with attention in C where the C library builds
    assert type(engine.attn_backend).__name__ in ("TorchAttentionBackend", "CAttentionBackend")
    assert isinstance(engine.attn_backend, TorchAttentionBackend)
    assert engine.model.model.norm.kernels.name == "torch"
    assert engine.graphs is None
    assert engine.kv_pool.num_pages == engine.num_pages + 1  # the padding page is never handed out
    assert llm.stats()["total_pages"] == engine.num_pages


@pytest.mark.parametrize("kwargs, fragment", [
    ({"attention": "flashinfer"}, "flashinfer"),
    ({"cuda_graph_max_bs": 4}, "CUDA graphs need"),
])
def test_gpu_only_options_fail_clearly_on_cpu(kwargs, fragment):
    with pytest.raises(InvalidParamsError, match=fragment):
        LLM("random:tiny-qwen3", max_running_req=2, **kwargs)
