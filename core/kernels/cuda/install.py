"""The CUDA wing installed on a model in one call, from what the plan chose.

Most of the wing is taken by the plan's other records, not installed: the kernels table runs the GEMVs and the
split-K linears from ``KernelChoices`` (core/kernels/dispatch.py), the attention backends their decode kernels,
the sampler the race. What sits on the model itself is installed here; with every switch off this does nothing.
"""

from __future__ import annotations

from torch import nn

from core.kernels.choices import KernelChoices
from core.kernels.cuda.screened_head import GpuScreenedHead


def install_cuda_fast_paths(model: nn.Module, kernels: KernelChoices, one_rank: bool) -> bool:
    """Put the plan's CUDA choices in place on ``model`` (the decoder, core/models/decoder.py): a greedy request's
    LM head screened through an int8 copy of its weight (screened_head.py), where the Triton GEMVs run and
    ``one_rank`` (no tensor parallelism: the screen needs the whole head). Returns whether the head screens."""
    if not (kernels.gpu_screened_head and one_rank):
        return False
    head = model.lm_head
    head.screen = GpuScreenedHead.of(head.weight)
    return True
