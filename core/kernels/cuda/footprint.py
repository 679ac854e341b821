"""What the CUDA wing's install takes of the card after the KV pool is made, counted before the pool is sized.

The engine sizes its pool from the memory left once the weights are loaded (core/engine/kv_budget.py), but the
wing installs after the pool, since its attention backend and graphs work on it. So what the install allocates
for as long as the engine lives is counted here, from the plan and the model's shape, by the rules that allocate
it: the LM head's int8 screen, the decode graphs' logits (each captured size keeps its own output), the prefill
graphs' logits and the activations their shared memory pool keeps for the largest chunk, and flashinfer's
workspace. The passing tensors of an eager step are not counted: the budget's reserve is for them.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

import torch

from core.arith import ceil_div
from core.config import EngineConfig
from core.kernels.cuda.attention.flashinfer_common import WORKSPACE_BYTES
from core.kernels.cuda.graphs.decode import batch_size_ladder
from core.kernels.cuda.graphs.prefill import graph_sizes, prefill_shape
from core.kernels.cuda.install import CudaPlan
from core.model_config import ModelConfig


@dataclass(frozen=True)
class CudaFootprint:
    """Bytes the install keeps on the card, by what keeps them."""

    screened_head: int = 0  # the head's int8 copy, a float32 scale and upper end a row
    decode_graphs: int = 0  # every captured size's logits, and the largest batch's activations
    prefill_graphs: int = 0  # every prefill graph's logits, and the largest chunk's activations
    workspace: int = 0  # flashinfer's float workspace

    @property
    def total(self) -> int:
        return sum(astuple(self))


def activation_bytes(cfg: ModelConfig, tokens: int, dtype: torch.dtype, tp: int = 1) -> int:
    """What one layer's pass over ``tokens`` tokens holds at its widest: the residual, the normed input and the
    layer's output beside the attention's (QKV and its output) or the MLP's (gate and up, and their product)."""
    attention = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim // tp + cfg.num_heads * cfg.head_dim // tp
    mlp = 3 * cfg.intermediate_size // tp
    return tokens * dtype.itemsize * (3 * cfg.hidden_size + max(attention, mlp))


def cuda_footprint(plan: CudaPlan, config: EngineConfig, cfg: ModelConfig, dtype: torch.dtype, max_seq_len: int,
                   tp: int = 1) -> CudaFootprint:
    """What ``install_cuda_fast_paths`` will keep on each rank's card for this plan (nothing with every switch
    off). Logits are the whole vocabulary's on every rank (gathered), in the model's dtype."""
    screened = plan.kernels.gpu_screened_head and tp == 1
    head = cfg.vocab_size * (cfg.hidden_size + 2 * 4) if screened else 0
    if plan.attention != "flashinfer":  # no graphs: at most the torch backend reading fp8 pages
        return CudaFootprint(head)
    row = ceil_div(cfg.vocab_size, tp) * tp * dtype.itemsize  # one row of logits
    decode = prefill = 0
    if plan.cuda_graph_max_bs:
        sizes = batch_size_ladder(plan.cuda_graph_max_bs)
        decode = ((sum(sizes) + (1 if screened else 0)) * row
                  + activation_bytes(cfg, plan.cuda_graph_max_bs, dtype, tp))
    if plan.prefill_graph:
        tokens, max_reqs = prefill_shape(config, max_seq_len)
        prefill = len(graph_sizes(tokens)) * max_reqs * row + activation_bytes(cfg, tokens, dtype, tp)
    return CudaFootprint(head, decode, prefill, WORKSPACE_BYTES)
