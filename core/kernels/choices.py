"""Which kernels the engine runs: one frozen record, decided when the engine is built (core/engine/plan.py).

The layers, the attention backend and the weight loader each take their part of it; none of them reads an
environment variable or asks again what the machine can run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelChoices:
    # flashinfer's norm, activation and RoPE kernels for the whole model: exactly when attention is flashinfer's,
    # so ``attention='torch'`` runs the whole model in plain torch, the reference to compare against
    flashinfer: bool = False
    # QK-norm, RoPE and the KV write as one Triton kernel (core/kernels/cuda/fused_qkv.py); the layers then hand the
    # QKV projection's output to the backend's ``attend_qkv``
    fused_qkv: bool = False
    # one-row linears as Triton GEMVs with the norm or the activation folded in (core/kernels/cuda/gemv.py)
    gemv: bool = False
    # captured decode batches of a few rows as one Triton kernel per layer (core/kernels/cuda/small_decode.py); it
    # starts from the QKV projection's output, so only with ``fused_qkv``
    small_decode: bool = False
    # the batch-1 Triton kernels (GEMVs, small-batch decode) as programmatic dependent launches (compute
    # capability 9.0 and up): each starts while the kernel before it finishes and reads what is fixed for the
    # step (weights, cached KV, page lists) before it waits for that kernel's output
    pdl: bool = False
    # temperature draws (the sampler's exponential race) on two Triton kernels over chunks of the vocabulary
    # (core/kernels/cuda/race.py) instead of torch.compile's one reduction per row (MINISGL_DISABLE_TRITON_SAMPLER=1:
    # torch.compile's): the race is bound by its arithmetic, which the chunks spread over the whole device
    triton_sampler: bool = False
    # the narrow linears (o_proj, down) of more than one row cut over their inputs into this many slices, the
    # slices' partial products summed by the add+RMSNorm after them (core/kernels/cuda/split_k.py); 0: one cuBLAS GEMM
    # (the plan takes MINISGL_SPLIT_K, default 2, where the Triton kernels run)
    split_k: int = 0
    # an fp8 pool's sequences read back for flashinfer's ragged prefill in one Triton launch a layer
    # (core/kernels/cuda/fp8_gather.py) instead of torch's ten
    fp8_gather: bool = False
    # float32 CPU linears on weights packed once for oneDNN (core/kernels/cpu/onednn_packed.py)
    packed_weights: bool = False
    # float32 CPU linears through the C GEMM on weights packed once into its panels (core/kernels/cpu/gemm.py),
    # in place of oneDNN's packing, on x86-64 with AVX-512
    c_gemm: bool = False
    # float32 CPU linears that are 4-bit codes with a scale and offset per block of 32 inputs (a Q4_1 GGUF's,
    # dequantised) read as those codes by the C GEMM and the C decode step (core/kernels/cpu/four_bit.py): the same
    # floats, expanded in registers or cache, a fifth of the bytes from memory
    four_bit_weights: bool = False
    # a greedy batch's LM head (no log-probabilities asked) screened through an int8 copy with AVX512-VNNI, only
    # the logits that can be a row's largest computed in float32 on the C GEMM's panels
    # (core/kernels/cpu/screened_head.py)
    screened_head: bool = False
    # on CUDA, a greedy one-row step's LM head screened the same way through an int8 copy read by a Triton kernel,
    # the kept logits computed by the plain GEMV's code (core/kernels/cuda/screened_head.py)
    gpu_screened_head: bool = False
    # one-row linears (batch-1 decode) packed too: oneDNN splits one row's product over the threads, the BLAS's
    # matrix-vector product runs on one, so this pays only with more than one torch thread
    packed_one_row: bool = False
    # CPU decoder linears as int8 weights with per-row scales (core/kernels/cpu/int8_weights.py); the LM head stays
    # packed float32
    int8_weights: bool = False
    # CPU linears and LM head on bf16 copies through AMX, float32 activations (core/kernels/cpu/bf16_weights.py)
    bf16_linears: bool = False

    def __post_init__(self) -> None:
        if (self.fused_qkv or self.gemv or self.fp8_gather or self.split_k) and not self.flashinfer:
            raise ValueError("the fused QKV, GEMV, fp8 gather and split-K kernels run in flashinfer's kernel set")
        if self.c_gemm and (self.packed_weights or self.bf16_linears):
            raise ValueError("the C GEMM is a float32 CPU engine's one form of its linears")
        if self.screened_head and not self.c_gemm:
            raise ValueError("the screened LM head computes its kept logits on the C GEMM's panels")
        if self.gpu_screened_head and not self.gemv:
            raise ValueError("the GPU's screened LM head computes its kept logits with the GEMV kernel")
        if self.packed_one_row and not self.packed_weights:
            raise ValueError("one-row packed linears need packed weights")
        if self.small_decode and not self.fused_qkv:
            raise ValueError("the small-batch decode kernel starts from the fused QKV path")
        if self.bf16_linears and (self.int8_weights or self.flashinfer):
            raise ValueError("bf16 linears are a float32 CPU engine's other form of its linears")
        if self.pdl and not (self.gemv or self.small_decode):
            raise ValueError("programmatic dependent launch is for the GEMV and small-batch decode kernels")

    @property
    def name(self) -> str:
        return "flashinfer" if self.flashinfer else "torch"
