"""The CPU wing installed on a model in one call, from what the plan chose.

Every fast path of a float32 CPU engine is a plug-in beside the torch reference: another form of a linear's
weight in its ``packed`` slot (which the kernels table, core/kernels/dispatch.py, runs), a screen on the LM head,
the whole single-request decode step as one C call (the engine's fast step, single_request.py), and decode
attention in C for the torch backend. With every switch off this does nothing and the model runs on torch alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from core.kernels.choices import KernelChoices
from core.kernels.cpu import decode
from core.kernels.cpu.attention import CDecodeAttention
from core.kernels.cpu.attention_backend import CAttentionBackend
from core.kernels.cpu.bf16_weights import bf16_linears
from core.kernels.cpu.decode import CpuDecodeStep
from core.kernels.cpu.decode_model import build_cpu_decode
from core.kernels.cpu.features import cpu_features
from core.kernels.cpu.four_bit import linear_codes
from core.kernels.cpu.gemm import four_bit_panels, panel_linears
from core.kernels.cpu.int8_weights import quantize_linears
from core.kernels.cpu.onednn_packed import pack_linears
from core.kernels.cpu.precision import PrecisionChoice
from core.kernels.cpu.screened_head import ScreenedHead
from core.kernels.cpu.single_request import SingleRequestDecode
from core.kernels.derived import DerivedCache
from core.kvcache.pool import KVPool
from core.model_config import ModelConfig


@dataclass
class CpuFastPaths:
    """What ``install_cpu_fast_paths`` put in place: how many linears took each other form of their weight, how
    many of the C GEMM's are 4-bit codes, whether the LM head screens greedy rows, the C decode step, the engine's
    fast step that runs it, and the torch backend with attention in C (None where not chosen)."""

    int8_linears: int = 0
    bf16_linears: int = 0
    packed_linears: int = 0
    four_bit_panels: int = 0
    screened_head: bool = False
    decode_step: CpuDecodeStep | None = None
    fast_step: SingleRequestDecode | None = None
    backend: CAttentionBackend | None = None


def install_cpu_fast_paths(model: nn.Module, cfg: ModelConfig, kernels: KernelChoices, precision: PrecisionChoice,
                           c_attention: bool, pool: KVPool, page_table: torch.Tensor, heads: tuple[int, int, int],
                           one_rank: bool, derived: DerivedCache) -> CpuFastPaths:
    """Put the plan's CPU choices in place on ``model`` (the decoder, core/models/decoder.py): ``kernels`` and
    ``precision`` say which, ``c_attention`` whether attention runs in C (the backend returned, for one rank's
    ``heads``); ``pool`` and ``page_table`` are what it and the C decode step read and write;
    ``one_rank``: no tensor parallelism (the screen needs the whole head); ``derived``: where what is derived
    from the weights is read back from (core/kernels/derived.py)."""
    threads = torch.get_num_threads()
    paths = CpuFastPaths()
    # precision int8 where the C step does not run: the decoder's linears quantised once (int8_weights.py)
    paths.int8_linears = quantize_linears(model) if kernels.int8_weights else 0
    # fast on a CPU with AMX: bf16 copies of the linears and the LM head (bf16_weights.py)
    paths.bf16_linears = bf16_linears(model) if kernels.bf16_linears else 0
    # float32 linears that are 4-bit codes (four_bit.py), found once for both C kernels reading them
    reads_codes = kernels.c_gemm or (precision.c_decode and not precision.c_int8)
    codes = linear_codes(model, derived) if kernels.four_bit_weights and reads_codes else {}
    # the other weights packed once, into the C GEMM's panels (gemm.py) or for oneDNN's GEMM (onednn_packed.py)
    paths.packed_linears = (panel_linears(model, threads, codes) if kernels.c_gemm else
                            pack_linears(model, kernels.packed_one_row) if kernels.packed_weights else 0)
    paths.four_bit_panels = four_bit_panels(model) if kernels.c_gemm else 0
    # a greedy batch's LM head screened through an int8 copy of its panels (screened_head.py)
    paths.screened_head = kernels.screened_head and one_rank
    if paths.screened_head:
        head = model.lm_head
        head.screen = ScreenedHead.of(head.weight, head.packed, derived)
    # a single request's decode step as one C call (decode.py), under int8 or fast on int8 copies of the weights
    if precision.c_decode:
        paths.decode_step = build_cpu_decode(model, cfg, pool, page_table.shape[1], threads, int8=precision.c_int8,
                                             int8_dots=precision.int8_dots, four_bit=codes, cache=derived)
        paths.fast_step = SingleRequestDecode(paths.decode_step, page_table)
    if c_attention:
        c_call = CDecodeAttention(decode.load_library().library, threads, avx512="avx512f" in cpu_features().flags)
        paths.backend = CAttentionBackend(pool, page_table, *heads, c_call)
    return paths
