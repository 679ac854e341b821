"""Host-to-device copies that never make the host wait: a step's metadata copied from pageable host memory may
wait for the device to drain its queue, undoing overlap scheduling; staged through pinned memory it is queued
like a kernel. torch's pinned-memory cache records each copy on its stream, so a staging block is not handed out
again before its copy has run."""

from __future__ import annotations

import numpy as np
import torch

_NUMPY_DTYPES = {torch.int64: np.int64, torch.int32: np.int32, torch.float32: np.float32}


def host_tensor(values: list | tuple, dtype: torch.dtype) -> torch.Tensor:
    """A host tensor of a Python list, built through numpy: ``torch.tensor`` of a list reads it element by element,
    several times slower than numpy, and a large batch's step builds thousands of indices."""
    return torch.from_numpy(np.array(values, dtype=_NUMPY_DTYPES[dtype]))


def upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` on ``device``; on a CPU device the same tensor."""
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def upload_list(values: list | tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return upload(host_tensor(values, dtype), device)


def pinned(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A pinned copy of a host tensor that a library copies to ``device`` itself (a no-op off CUDA)."""
    return host.pin_memory() if device.type == "cuda" else host
