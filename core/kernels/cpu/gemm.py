"""Every float32 linear of a CPU engine as one C GEMM on a weight packed once into panels
(core/kernels/cpu/gemm.c), on an x86-64 CPU with AVX-512.

At a decode step's row counts this kernel beats oneDNN's packed GEMM and torch's BLAS; at a prefill's thousands of
rows the BLAS's blocking for large products wins (docs/BENCHMARKS.md has the table): so batches of up to
``MAX_ROWS`` rows take the panels and larger ones torch's BLAS (``takes``). Each output
is one in-order sum, so a request's products are the same whatever shares its batch (of up to ``MAX_ROWS``
rows), and close to (not bit-identical with) torch's.

The panels take the layer's ``packed`` slot (as oneDNN's packed copy would); the float32 weight stays, for large
batches, the C decode step of one request (core/kernels/cpu/decode.py), tensor-parallel slicing and the embedding
lookup of a tied LM head.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from core.kernels.c_build import BuildResult, address, build_library, x86_unsupported_reason
from core.kernels.cpu.four_bit import Q4Codes

SOURCE = Path(__file__).with_name("gemm.c")
# the AVX-512 code is marked in the source (target attributes): the rest builds for any x86-64 with AVX2
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-std=c11")
NEEDED_FLAGS = {"avx512f": "AVX-512F", "fma": "FMA"}
MAX_ROWS = 512  # larger batches run faster on torch's BLAS (see above)

_P = ctypes.c_void_p


def unsupported_reason(flags: frozenset[str], machine: str | None = None) -> str:
    """Why this CPU cannot run the GEMM ('' when it can): it needs x86-64 with AVX-512F and FMA."""
    return x86_unsupported_reason("the C GEMM", NEEDED_FLAGS, flags, machine)


_I64, _INT = ctypes.c_int64, ctypes.c_int
SIGNATURES = {
    "panel_floats": ([_I64, _I64], _I64),
    "pack_panels": ([_P, _I64, _I64, _P], None),
    "q4_panel_bytes": ([_I64, _I64], _I64),
    "q4_slab_floats": ([], _I64),
    "pack_q4": ([_P, _P, _P, _I64, _I64, _P], None),
    "gemm_panels": ([_P, _I64, _I64, _P, _P, _P, _I64, _P, _P, _INT], None),
    "norm_gemm_panels": ([_P, _P, _P, ctypes.c_float, _I64, _I64, _P, _P, _P, _I64, _P, _P, _P, _P, _INT], None),
    "silu_mul_gemm_panels": ([_P, _I64, _I64, _P, _P, _P, _I64, _P, _P, _INT], None),
    # the greedy LM head's screen (core/kernels/cpu/screened_head.py)
    "screen_bytes": ([_I64, _I64], _I64),
    "screen_blocks": ([_I64], _I64),
    "screen_pack": ([_P, _P, _I64, _I64, _P, _P, _P], None),
    "screened_logits_rows": ([_P, _I64, _I64, _P, _I64] + [_P] * 10 + [_INT], None),
}


@lru_cache(maxsize=1)
def load_library() -> BuildResult:
    """Built once per process (and once per machine: the object is cached in MINISGL_HOME)."""
    return build_library(SOURCE, FLAGS, signatures=SIGNATURES)


def _library() -> ctypes.CDLL:
    lib = load_library().library
    if lib is None:
        raise RuntimeError(f"the C GEMM is not built: {load_library().reason}")
    return lib


PANEL = 48  # gemm.c's output features per panel


@dataclass(frozen=True)
class PanelWeight:
    """A float32 weight [out, in] packed into the GEMM's panels, and the threads its products run on (torch's,
    read when the engine packed it). With ``q4`` the panels are held in their 4-bit form instead (``panels`` is
    then empty, and ``scratch`` is where each thread expands a slab of one panel at a time): the same floats, a
    sixth of the bytes."""

    panels: torch.Tensor
    out_features: int
    in_features: int
    threads: int
    q4: torch.Tensor | None = None
    scratch: torch.Tensor | None = None

    @classmethod
    def of(cls, weight: torch.Tensor, threads: int, codes: Q4Codes | None = None) -> "PanelWeight":
        """``codes``: the weight's 4-bit codes (core/kernels/cpu/four_bit.py's ``q4_codes``), held as 4-bit panels,
        which leaves every float as it is; float32 panels without them."""
        weight = weight.detach().contiguous()
        if weight.dtype != torch.float32 or weight.dim() != 2 or weight.device.type != "cpu":
            raise ValueError(f"the C GEMM packs 2-D float32 CPU weights, got {weight.dtype} {tuple(weight.shape)}")
        out_features, in_features = weight.shape
        lib = _library()
        if codes is not None:
            q4 = torch.empty(lib.q4_panel_bytes(out_features, in_features), dtype=torch.uint8)
            lib.pack_q4(codes[0].data_ptr(), codes[1].data_ptr(), codes[2].data_ptr(), out_features, in_features,
                        q4.data_ptr())
            return cls(torch.empty(0), out_features, in_features, threads, q4, _scratch(threads))
        panels = torch.empty(lib.panel_floats(out_features, in_features), dtype=torch.float32)
        lib.pack_panels(weight.data_ptr(), out_features, in_features, panels.data_ptr())
        return cls(panels, out_features, in_features, threads)

    @staticmethod
    def takes(x: torch.Tensor) -> bool:
        """Whether a batch of these rows runs on the panels (up to MAX_ROWS; above, torch's BLAS is faster)."""
        return x.numel() <= MAX_ROWS * x.shape[-1]

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ weight.T + bias`` for float32 x [..., in]."""
        rows = self._rows(x, self.in_features)
        out = torch.empty(rows.shape[0], self.out_features, dtype=torch.float32)
        _library().gemm_panels(rows.data_ptr(), rows.shape[0], self.in_features, *self._weights(),
                               self.out_features, address(bias), out.data_ptr(), self.threads)
        return out.reshape(*x.shape[:-1], self.out_features)

    def norm_linear(self, x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                    bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(linear(rms_norm(x + residual)), x + residual) in one call, as TorchKernels.rms_norm_linear; with no
        residual, x itself is normed and is the residual."""
        rows = self._rows(x, self.in_features)
        summed = None if residual is None else self._rows(residual, self.in_features)
        normed, out = torch.empty_like(rows), torch.empty(rows.shape[0], self.out_features, dtype=torch.float32)
        new_residual = rows if summed is None else torch.empty_like(rows)
        _library().norm_gemm_panels(rows.data_ptr(), address(summed), address(norm_weight), eps,
                                    rows.shape[0], self.in_features, *self._weights(), self.out_features,
                                    address(bias), normed.data_ptr(), new_residual.data_ptr(), out.data_ptr(),
                                    self.threads)
        return out.reshape(*x.shape[:-1], self.out_features), new_residual.reshape(x.shape)

    def silu_mul_linear(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``(silu(gate) * up) @ weight.T`` for gate_up [..., 2 * in] (gate then up), in one call."""
        rows = self._rows(gate_up, 2 * self.in_features)
        act, out = torch.empty(rows.shape[0], self.in_features), torch.empty(rows.shape[0], self.out_features)
        _library().silu_mul_gemm_panels(rows.data_ptr(), rows.shape[0], self.in_features, *self._weights(),
                                        self.out_features, act.data_ptr(), out.data_ptr(), self.threads)
        return out.reshape(*gate_up.shape[:-1], self.out_features)

    def _weights(self) -> tuple[int, int | None, int | None]:
        """The C calls' (panels, q4, scratch) pointers."""
        return self.panels.data_ptr(), address(self.q4, torch.uint8), address(self.scratch)

    @staticmethod
    def _rows(x: torch.Tensor, width: int) -> torch.Tensor:
        if x.dtype != torch.float32 or x.shape[-1] != width:
            raise ValueError(f"the C GEMM takes float32 [..., {width}], got {x.dtype} {tuple(x.shape)}")
        return x.reshape(math.prod(x.shape[:-1]), width).contiguous()


def four_bit_panels(model: nn.Module) -> int:
    """How many of the model's layers hold their panels in 4-bit form."""
    return sum(isinstance(getattr(m, "packed", None), PanelWeight) and m.packed.q4 is not None
               for m in model.modules())


@lru_cache(maxsize=None)
def _scratch(threads: int) -> torch.Tensor:
    """Where each thread expands a slab of a 4-bit panel (small enough to stay in its L1 cache): shared by every
    4-bit weight (one product runs at a time)."""
    return torch.empty(threads * _library().q4_slab_floats(), dtype=torch.float32)


def panel_linears(model: nn.Module, threads: int, codes: dict[nn.Module, Q4Codes] | None = None) -> int:
    """Give every layer with an empty ``packed`` slot (the decoder's linears and the LM head) its panels, once, at
    load (in 4-bit form for the layers ``codes`` has, see ``PanelWeight.of``); returns how many."""
    codes = codes or {}
    count = 0
    for module in model.modules():
        if getattr(module, "packed", True) is None:
            module.packed = PanelWeight.of(module.weight, threads, codes.get(module))
            count += 1
    return count
