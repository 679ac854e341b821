"""The CPU wing's part of the engine's plan: what ``--precision`` comes to on this machine, and whether the C
kernels run here (core/kernels/cpu/decode.c, gemm.c).

``plan_cpu_precision`` returns the frozen ``PrecisionChoice`` the plan stores (core/engine/plan.py); the other
functions answer, once, whether a C kernel can run and why not. Nothing here runs a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core import env
from core.config import EngineConfig
from core.errors import InvalidParamsError
from core.kernels.cpu import decode, gemm
from core.kernels.cpu.features import CpuFeatures, cpu_features


@dataclass(frozen=True)
class PrecisionChoice:
    """What ``precision`` came to on this machine: the model's dtype, whether the torch layers' decoder linears
    are int8, whether a single request's decode steps run the C step (core/kernels/cpu/decode.py), whether that
    step reads int8 copies of the linears and the LM head and with integer dot products, and one line saying
    what was picked and why (empty for 'exact')."""

    dtype: torch.dtype
    int8_weights: bool = False
    note: str = ""
    c_decode: bool = False
    c_int8: bool = False  # the C step on int8 copies of the weights, made beside the torch layers' float32 ones
    int8_dots: bool = False  # the int8 C step quantises each product's input for integer dot products
    bf16_linears: bool = False  # the torch layers' linears and LM head on bf16 copies through AMX (float32 activations)

    @property
    def words(self) -> str:
        """How the engine's description names the weights' other forms ('' for none)."""
        words = ["int8 weight-only linears"] if self.int8_weights else []
        if self.bf16_linears:
            words.append("bf16 linears (AMX) for prefill and batches")
        if self.c_decode:
            on_int8 = " on int8 weights" if self.c_int8 and not self.int8_weights else ""
            words.append(f"single-request decode steps in C{on_int8}")
        return ", ".join(words)


BF16_LINEARS = ("bf16 copies of the linears and the LM head through AMX-BF16 (activations, attention and the KV "
                "cache float32)")


def plan_cpu_precision(config: EngineConfig, device: torch.device, dtype: torch.dtype,
                     features: CpuFeatures | None = None) -> PrecisionChoice:
    """'exact' keeps ``dtype``; on a CPU running float32 a single request's decode steps run the C step on the
    same float32 weights where it runs (core/kernels/cpu/decode.py: its sums run in another order than torch's,
    as oneDNN's do against transformers', and it is what batch 1 feels: faster than torch's step).
    'fast' on a CPU running float32: where the C step runs, what 'int8' picks there (int8 C step, float32 for
    prefill and batches), the fastest at batch 1 and in throughput on the CPUs measured; with AMX, prefill and
    batches on bf16 copies of the linears and LM head (core/kernels/cpu/bf16_weights.py: AMX makes bf16 GEMMs beat
    float32's from a few rows), with or without the C step; else float32 as it is, and the note names what the
    CPU lacks. bf16 with AVX512-BF16 alone is not picked: without AMX whole-bf16 layers ran slower than float32
    (docs/BENCHMARKS.md). 'int8' (a CPU in float32 only) runs a single
    request's decode steps in C on int8 copies of the weights where the C step runs, with prefill and batches on
    the float32 weights kept beside them (torch's int8 weight-only kernel ran batches at a fifth of float32's
    speed on the AVX2 CPU and an eighth on the AVX-512 one); where it does not, the torch layers' linears are
    int8. ``features`` defaults to this machine's (core/kernels/cpu/features.py)."""
    cpu_float32 = device.type == "cpu" and dtype == torch.float32
    if config.precision == "exact":
        if not cpu_float32:
            return PrecisionChoice(dtype)
        return PrecisionChoice(dtype, c_decode=not c_decode_unavailable(config, features or cpu_features()))
    if config.precision == "int8":
        if not cpu_float32:
            raise InvalidParamsError("precision 'int8' runs float32 activations on a CPU; use it with --device cpu "
                                     "and no --dtype (or --dtype float32)")
        return int8_choice(config, dtype, features or cpu_features())
    if not cpu_float32:
        name = str(dtype).removeprefix("torch.")
        return PrecisionChoice(dtype, note=f"precision fast: {name} on {device.type} as it is; the reduced-precision "
                                           f"weights are chosen for a CPU running float32")
    features = features or cpu_features()
    why_not_c = c_decode_unavailable(config, features)
    if not why_not_c:
        return int8_c_step(dtype, "fast", bf16_linears=features.amx_bf16)
    if features.amx_bf16:
        return PrecisionChoice(dtype, bf16_linears=True, note=f"precision fast: every step on {BF16_LINEARS}; one "
                                                              f"request's decode steps not in C: {why_not_c}")
    bf16 = "this CPU lacks AMX-BF16 for bf16" + (" (AVX512-BF16 alone measured slower than float32)"
                                                 if "avx512_bf16" in features.flags else "")
    return PrecisionChoice(dtype, note=f"precision fast: kept exact float32: the int8 decode step does not run in C "
                                       f"({why_not_c}), {bf16}, and torch's int8 weight-only kernel is slower "
                                       f"than float32; --precision int8 forces int8")


def int8_c_step(dtype: torch.dtype, precision: str, bf16_linears: bool = False) -> PrecisionChoice:
    """The int8 C step with prefill and batches on float32 (on bf16 copies of the linears with
    ``bf16_linears``), as 'int8' and 'fast' pick it where the C step runs; ``precision`` names the choice in its
    note."""
    dots = not env.disabled("INT8_DOTS")
    inputs = "int8 inputs (integer dot products)" if dots else "float32 inputs"
    batches = (BF16_LINEARS if bf16_linears else
               "the float32 weights, kept beside them (torch's int8 weight-only kernel is slower than float32 for "
               "batches)")
    return PrecisionChoice(dtype, c_decode=True, c_int8=True, int8_dots=dots, bf16_linears=bf16_linears,
                           note=f"precision {precision}: one request's decode steps in C (AVX2 and FMA) on int8 "
                                f"weights with a scale per row (decoder linears and LM head) and {inputs}; prefill "
                                f"and batches of more requests on {batches}")


def int8_choice(config: EngineConfig, dtype: torch.dtype, features: CpuFeatures) -> PrecisionChoice:
    """'int8' on a CPU running float32: where the C step runs, it reads int8 copies of the linears and the torch
    layers stay float32 (packed) for prefill and batches; else the torch layers' linears are int8."""
    why_not_c = c_decode_unavailable(config, features)
    if not why_not_c:
        return int8_c_step(dtype, "int8")
    return PrecisionChoice(dtype, int8_weights=True,
                           note=f"precision int8: decoder linears as int8 weights with a scale per row on torch, "
                                f"activations and KV cache in float32; one request's decode steps not in C: "
                                f"{why_not_c}")


def c_decode_unavailable(config: EngineConfig, features: CpuFeatures) -> str:
    """Why a float32 CPU engine cannot run the C decode step ('' when it can); builds it (once) to know."""
    if env.disabled("CPU_DECODE"):
        return "MINISGL_DISABLE_CPU_DECODE turned the C decode step off"
    if config.tp > 1:
        return "the C decode step runs on one rank only"
    if config.kv_dtype == "fp8":
        return "the C decode step reads a float32 KV cache, not fp8"
    return c_library_unavailable(features)


def c_library_unavailable(features: CpuFeatures) -> str:
    """Why the CPU's C kernels (core/kernels/cpu/decode.c) cannot run here ('' when they can); builds them (once)
    to know."""
    return decode.unsupported_reason(features.flags) or decode.load_library().reason


def c_attention_runs(device: torch.device, dtype: torch.dtype, attention: str, kv_fp8: bool) -> bool:
    """Decode attention in C: the torch backend on a CPU over a float32 pool, where the C kernels build;
    MINISGL_DISABLE_CPU_DECODE=1 keeps SDPA (the switch of the C decode step, whose code it shares)."""
    if device.type != "cpu" or dtype != torch.float32 or attention != "torch" or kv_fp8:
        return False
    return not env.disabled("CPU_DECODE") and not c_library_unavailable(cpu_features())


def c_gemm_unavailable(device: torch.device, dtype: torch.dtype, features: CpuFeatures) -> str:
    """Why the float32 linears cannot run on the C GEMM ('' when they can): a CPU engine in float32 on x86-64
    with AVX-512, where the library builds (once, to know)."""
    if device.type != "cpu" or dtype != torch.float32:
        return "the C GEMM is for a CPU engine in float32"
    if env.disabled("CPU_GEMM"):
        return "MINISGL_DISABLE_CPU_GEMM turned the C GEMM off"
    return gemm.unsupported_reason(features.flags) or gemm.load_library().reason
