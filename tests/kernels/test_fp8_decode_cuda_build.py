"""The CUDA fp8 decode's source builds with nvcc for Hopper (where nvcc is installed: a CPU machine can compile
it, only a GPU can run it), and the checks that decide where it runs say why not in one line."""

from __future__ import annotations

import pytest
import torch

from core.kernels.cuda import fp8_decode as fp8_decode_cuda
from core.kernels.cuda.fp8_decode import SIGNATURES, find_nvcc, shape_unsupported_reason


@pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc")
def test_the_kernel_compiles_for_sm90_and_exports_its_entry_point(tmp_path, monkeypatch):
    monkeypatch.setenv("MINISGL_HOME", str(tmp_path))
    fp8_decode_cuda.load_library.cache_clear()
    try:
        built = fp8_decode_cuda.load_library("90")
    finally:
        fp8_decode_cuda.load_library.cache_clear()
    assert built.reason == "" and built.library is not None
    entry = built.library.minisgl_fp8_decode
    assert (entry.argtypes, entry.restype) == SIGNATURES["minisgl_fp8_decode"]
    assert list(tmp_path.rglob("fp8_decode-*.so"))


def test_shapes_it_cannot_take_are_named():
    assert shape_unsupported_reason(16, 8, 128, torch.bfloat16) == ""
    assert shape_unsupported_reason(14, 2, 64, torch.float16) == ""
    assert "head dims" in shape_unsupported_reason(16, 8, 96, torch.bfloat16)
    assert "8 query heads" in shape_unsupported_reason(32, 2, 128, torch.bfloat16)
    assert "float32" in shape_unsupported_reason(16, 8, 128, torch.float32)


def test_a_cpu_device_is_refused_before_anything_is_built():
    assert "CUDA device" in fp8_decode_cuda.unavailable_reason(torch.device("cpu"))
