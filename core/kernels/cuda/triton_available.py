"""Whether the project's Triton kernels (the ``*_triton.py`` modules beside this one) can run: triton must
import, and the tensors must be on CUDA, or on a CPU under Triton's interpreter (``TRITON_INTERPRET=1``, how
the tests run them without a GPU). Triton itself is imported only when a kernel is first launched, so the
engine imports without it.
"""

from __future__ import annotations

import functools
import os

import torch


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # ImportError, or a broken install raising anything at import
        return False
    return True


def triton_runs_on(device: torch.device | str) -> bool:
    device = torch.device(device)
    interpreted_cpu = device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    return triton_available() and (device.type == "cuda" or interpreted_cpu)
