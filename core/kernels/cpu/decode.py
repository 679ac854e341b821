"""A single request's decode step on a CPU as one C call (core/kernels/cpu/decode.c): on float32 weights under
``--precision exact`` (the default), on int8 copies under ``int8`` and ``fast``.

At one row a decode step reads every weight once and does little else, so its floor is the weights' bytes over
the memory's bandwidth. Through torch, one-row products reach about two thirds of that bandwidth and the
thousands of small ops between them cost as much again; the C step streams the weights with all threads and
runs the small work between barriers of one parallel region (its products alone beat oneDNN's packed path;
docs/BENCHMARKS.md).

Under ``--precision int8`` (and ``fast``) the decoder's linears are int8 copies with per-row scales made by
core/kernels/cpu/int8_weights.py, beside the torch layers' float32 weights (torch's int8 kernel is slow for batches),
a quarter of the bytes to stream, and the LM head is an int8 copy quantised the same way (with
tied embeddings the float32 table stays for the row lookup of the input token). Each product's input is then
quantised to int8 too (a scale per block of ``QBLOCK`` values), for integer dot products (AVX2's maddubs and
madd), and the step keeps its int8 weights tiled (``tiled``: eight rows interleaved by blocks, so each pass
streams one contiguous run of bytes, which the prefetcher follows better than eight). The tiled
copies replace the row-major ones, except the LM head's, kept for what the step computes (``lm_head``).

Its sums run in another order than torch's, so on float32 weights it is close to the torch path (logits within
about 1e-5), not bit-identical, as oneDNN's packed products are not bit-identical to transformers' own; the tokens
are checked against transformers like the torch path's. The engine uses it only for decode steps of one
request, only for float32 on an x86-64 CPU with AVX2 and FMA, on one rank, with a float32 KV pool. Everything
else (prefill, batches of more rows) stays on torch, and its KV writes land in the same pool, so the two paths
interleave.

This module knows the kernel's records and how to call it; the engine maps its model onto them
(core/kernels/cpu/decode_model.py), so kernels never import the model.
"""

from __future__ import annotations

import ctypes
from dataclasses import astuple, dataclass, replace
from functools import lru_cache
from pathlib import Path

import torch

from core.kernels.c_build import BuildResult, address, build_library, x86_unsupported_reason
from core.kernels.derived import DerivedCache
from core.kernels.cpu.four_bit import Q4Codes, q4_rows
from core.kernels.cpu.int8_weights import Int8Weight

SOURCE = Path(__file__).with_name("decode.c")
# -mavx2 -mfma rather than -march=native: a cached object must run on any AVX2 machine sharing the cache
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-std=c11")
NEEDED_FLAGS = {"avx2": "AVX2", "fma": "FMA"}
QBLOCK = 32  # integer dot products: the inputs' values per scale (decode.c's QBLOCK)
# what a greedy step's screen reads per LM-head weight: its int8 copy and each block's float32 sum of magnitudes
SCREEN_BYTES_PER_WEIGHT = 1 + 4 / QBLOCK

_P = ctypes.c_void_p


class _Weight(ctypes.Structure):
    _fields_ = [("values", _P), ("scales", _P), ("q4", _P)]


LINEARS = ("qkv", "o_proj", "gate_up", "down")


class _Layer(ctypes.Structure):
    _fields_ = [(name, _P) for name in ("input_norm", "qkv_bias", "q_norm", "k_norm")] + \
               [(name, _Weight) for name in LINEARS] + \
               [(name, _P) for name in ("post_norm", "k_cache", "v_cache")]


class _Shape(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int32) for name in ("hidden", "intermediate", "heads", "kv_heads", "head_dim",
                                                    "layers", "vocab", "threads", "int_dots")] + \
               [(name, ctypes.c_float) for name in ("eps", "qk_eps", "scale")]


class _Step(ctypes.Structure):
    _fields_ = [("token", _P), ("position", _P), ("slots", _P), ("len", ctypes.c_int64), ("embedding", _P),
                ("final_norm", _P), ("lm_head", _Weight)] + [(name, _P) for name in ("rope", "logits", "scratch")] + \
               [("screen", _Weight), ("screen_l1", _P), ("screen_bounds", _P), ("screen_tops", _P)]


def unsupported_reason(flags: frozenset[str], machine: str | None = None) -> str:
    """Why this CPU cannot run the C step ('' when it can): it needs x86-64 with AVX2 and FMA."""
    return x86_unsupported_reason("the C decode step", NEEDED_FLAGS, flags, machine)


_I64, _INT = ctypes.c_int64, ctypes.c_int
SIGNATURES = {
    "decode_step": ([ctypes.POINTER(_Shape), ctypes.POINTER(_Layer), ctypes.POINTER(_Step)], None),
    "scratch_floats": ([ctypes.POINTER(_Shape), _I64], _I64),
    "gemv": ([_P, _P, _I64, _INT, _P, _INT], None),
    "gemv_int8": ([_P, _P, _P, _I64, _INT, _P, _INT], None),
    "gemv_int8_dots": ([_P, _P, _P, _I64, _INT, _P, _INT, _P, _P], None),
    "tile_int8": ([_P, _I64, _INT, _P], None),
    "decode_attention": ([_P, _P, _P, _P, _P, _I64, _I64, _INT, _INT, _INT, ctypes.c_float, _P, _INT, _INT], None),
    "attend_from_qkv": ([_P, _P, _P, _P, _P, ctypes.c_float, _P, _P, _P, _P, _P, _P, _I64, _I64, _INT, _INT, _INT,
                         ctypes.c_float, _P, _P, _INT, _INT], None),
}


@lru_cache(maxsize=1)
def load_library() -> BuildResult:
    """Built once per process (and once per machine: the object is cached in MINISGL_HOME)."""
    return build_library(SOURCE, FLAGS, signatures=SIGNATURES)


@dataclass(frozen=True)
class DecodeShape:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    eps: float
    qk_eps: float = 0.0  # the per-head q/k norm's epsilon (models with QK-norm)


@dataclass(frozen=True)
class FourBitRows:
    """A float32 weight made of 4-bit codes, as the step reads it instead (core/kernels/cpu/four_bit.py's q4_rows):
    the same floats, a fifth of the bytes."""

    rows: torch.Tensor  # [out, in / 32, 24] uint8

    @classmethod
    def of(cls, codes: Q4Codes) -> "FourBitRows":
        return cls(q4_rows(codes))


StepWeight = torch.Tensor | Int8Weight | FourBitRows  # a linear as the step reads it


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's tensors as the C step reads them (contiguous; see decode.c). A linear is a float32
    weight, its ``FourBitRows``, or an ``Int8Weight`` (int8 values and float32 scales per row)."""

    input_norm: torch.Tensor
    qkv: StepWeight  # [q + k + v rows, hidden]
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o_proj: StepWeight
    post_norm: torch.Tensor
    gate_up: StepWeight  # [2 * intermediate, hidden]: gate rows, then up rows
    down: StepWeight
    k_cache: torch.Tensor  # this layer's [slots, kv_heads, head_dim] of the pool
    v_cache: torch.Tensor


def _weight(w: StepWeight) -> _Weight:
    if isinstance(w, FourBitRows):
        return _Weight(None, None, address(w.rows, torch.uint8))
    if isinstance(w, Int8Weight):
        return _Weight(address(w.values, torch.int8), address(w.scales))
    return _Weight(address(w), None)


def tiled(lib: ctypes.CDLL, w: torch.Tensor | Int8Weight) -> torch.Tensor | Int8Weight:
    """An int8 weight's values in the tiled layout the integer dot products read (decode.c's tile_int8: rows
    interleaved by blocks, eight rows at a time, so a pass over them is one stream); a float32 weight as it is."""
    if not isinstance(w, Int8Weight):
        return w
    rows, cols = w.values.shape
    out = torch.empty_like(w.values)
    lib.tile_int8(address(w.values, torch.int8), rows, cols, out.data_ptr())
    return Int8Weight(out, w.scales)


def block_magnitudes(weight: torch.Tensor) -> torch.Tensor:
    """[rows, blocks]: each row's sum of magnitudes over each block of QBLOCK inputs (the last block shorter), in
    float64 and rounded up to float32, so that the screen's bound never comes out low."""
    w = weight.detach().double().abs()
    rows, cols = w.shape
    blocks = -(-cols // QBLOCK)
    w = torch.nn.functional.pad(w, (0, blocks * QBLOCK - cols)).view(rows, blocks, QBLOCK).sum(dim=2)
    return torch.nextafter(w.float(), torch.tensor(float("inf"))).contiguous()


def head_int8(weight: torch.Tensor, cache: DerivedCache) -> Int8Weight:
    """The LM head's int8 copy (what both screens estimate on), read back from ``cache`` or quantised now."""
    return Int8Weight(*cache.get("lm_head.int8", lambda: astuple(Int8Weight.quantize(weight))))


def head_block_magnitudes(weight: torch.Tensor, cache: DerivedCache) -> torch.Tensor:
    """``block_magnitudes`` of the LM head, read back from ``cache`` or computed now."""
    return cache.get("lm_head.block_l1", lambda: (block_magnitudes(weight),))[0]


def _layer(w: LayerWeights) -> _Layer:
    return _Layer(**{name: (_weight(getattr(w, name)) if name in LINEARS else address(getattr(w, name)))
                     for name, _ in _Layer._fields_})


class CpuDecodeStep:
    """Callable on one request's decode inputs; returns the logits [1, vocab]. Holds the tensors it points at."""

    def __init__(self, shape: DecodeShape, layers: list[LayerWeights], embedding: torch.Tensor,
                 final_norm: torch.Tensor, lm_head: torch.Tensor | Int8Weight, rope_cos_sin: torch.Tensor,
                 max_len: int, threads: int, int_dots: bool = False, cache: DerivedCache | None = None) -> None:
        """A float32 ``lm_head`` also gets an int8 copy and its rows' sums of magnitudes, for greedy steps
        (``screen``: decode.c's screened_logits), read back from ``cache`` where it has them."""
        lib = load_library().library
        if lib is None:
            raise RuntimeError("the C decode step is not built")
        self._lib = lib
        if int_dots:  # the step reads its int8 weights tiled (the row-major copies are dropped)
            layers = [replace(w, **{name: tiled(lib, getattr(w, name)) for name in LINEARS}) for w in layers]
        self.layers_kept = layers  # the tensors the records point at (int8 copies among them) stay alive here
        self._keep = (embedding, final_norm, rope_cos_sin)
        self.lm_head = lm_head  # what the step multiplies the final hidden state by (an int8 copy under int8)
        self._head = tiled(lib, lm_head) if int_dots else lm_head  # the same, as the step reads it
        self.shape = _Shape(shape.hidden, shape.intermediate, shape.heads, shape.kv_heads, shape.head_dim,
                            len(layers), shape.vocab, threads, int(int_dots), shape.eps, shape.qk_eps,
                            shape.head_dim ** -0.5)
        self.layers = (_Layer * len(layers))(*(_layer(w) for w in layers))
        self.max_len = max_len
        self.scratch = torch.empty(lib.scratch_floats(ctypes.byref(self.shape), max_len), dtype=torch.float32)
        self.vocab = shape.vocab
        self.step = _Step(None, None, None, 0, address(embedding), address(final_norm), _weight(self._head),
                          address(rope_cos_sin), None, address(self.scratch))
        # the screen's tensors (kept alive here) and the step's fields that point at them, set per greedy call
        self._screen: tuple[Int8Weight, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._screen_fields: dict[str, object] = {}
        if not isinstance(lm_head, Int8Weight):
            cache = cache or DerivedCache()
            head8, l1 = tiled(lib, head_int8(lm_head, cache)), head_block_magnitudes(lm_head, cache)
            bounds, tops = torch.empty(shape.vocab, dtype=torch.float32), torch.empty(threads, dtype=torch.float32)
            self._screen = (head8, l1, bounds, tops)
            self._screen_fields = dict(screen=_weight(head8), screen_l1=address(l1), screen_bounds=address(bounds),
                                       screen_tops=address(tops))
        self._no_screen: dict[str, object] = dict(screen=_Weight(None, None), screen_l1=None, screen_bounds=None,
                                                  screen_tops=None)

    def __call__(self, token: torch.Tensor, position: torch.Tensor, slots: torch.Tensor,
                 screen: bool = False) -> torch.Tensor:
        """token, position: one-element int64 tensors; slots: the request's int64 KV slots, the new token's last
        (its K and V are written there). ``screen`` (a greedy step that wants no log-probabilities): with a
        float32 LM head only the rows that can hold the largest logit are computed in float32, the others come back
        as -inf; the largest logit and its first row are the full product's."""
        if not (token.dtype == position.dtype == slots.dtype == torch.int64) or not slots.is_contiguous():
            raise ValueError("the C decode step takes int64 token, position and contiguous slots")
        length = slots.shape[0]
        if not 0 < length <= self.max_len:
            raise ValueError(f"{length} cached tokens, the C decode step holds room for 1 to {self.max_len}")
        logits = torch.empty(1, self.vocab, dtype=torch.float32)
        step = self.step
        step.token, step.position, step.slots = token.data_ptr(), position.data_ptr(), slots.data_ptr()
        step.len = length
        step.logits = logits.data_ptr()
        for name, value in (self._screen_fields if screen and self._screen_fields else self._no_screen).items():
            setattr(step, name, value)
        self._lib.decode_step(ctypes.byref(self.shape), self.layers, ctypes.byref(step))
        return logits
