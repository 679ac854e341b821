"""The options every command shares, declared once as annotated types, and the values they collect into.

Sampling options default to None, meaning "not given": a prompt file's per-prompt values apply then, and a
value typed on the command line overrides them for every prompt.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import typer

from core.choices import ATTENTION_BACKENDS, CACHE_TYPES, KV_DTYPES, PRECISIONS

DEFAULT_CACHE = "radix"
DEFAULT_MAX_RUNNING = 32
DEFAULT_PAGE_SIZE = 1

# the metavar of an on/off option: nothing (Typer would show "<bool>", as if it took a value)
FLAG = ""

_ENGINE = "Engine"
_SAMPLING = "Sampling"

Model = Annotated[Optional[str], typer.Option(
    "--model", "-m", metavar="PATH", rich_help_panel=_ENGINE,
    help="A Hugging Face model directory or a .gguf file. Default: the embedded SmolLM2-135M-Instruct.")]
Cache = Annotated[Literal[CACHE_TYPES], typer.Option(
    "--cache", rich_help_panel=_ENGINE,
    help="KV cache policy: 'naive' frees a request's pages when it ends, 'radix' shares prompt prefixes.")]
PageSize = Annotated[int, typer.Option("--page-size", min=1, rich_help_panel=_ENGINE,
                                       help="Tokens per KV page.")]
MaxRunning = Annotated[int, typer.Option("--max-running", min=1, rich_help_panel=_ENGINE,
                                         help="Most requests in one batch.")]
NumPages = Annotated[Optional[int], typer.Option(
    "--num-pages", min=1, rich_help_panel=_ENGINE,
    help="KV pool size in pages (default: sized for this machine). Small pools make requests wait.")]
Attention = Annotated[Optional[Literal[ATTENTION_BACKENDS]], typer.Option(
    "--attention", rich_help_panel=_ENGINE,
    help="Attention backend: 'torch' (any device) or 'flashinfer' (CUDA). Default: flashinfer on CUDA when "
         "installed, else torch.")]
CudaGraphMaxBs = Annotated[Optional[int], typer.Option(
    "--cuda-graph-max-bs", min=0, rich_help_panel=_ENGINE,
    help="Largest decode batch captured as a CUDA graph; 0 turns graphs off (CUDA only).")]
Tp = Annotated[int, typer.Option("--tp", min=1, rich_help_panel=_ENGINE,
                                 help="Tensor-parallel ranks: split the model over N processes (GPUs on CUDA).")]
Dtype = Annotated[Optional[str], typer.Option(
    "--dtype", rich_help_panel=_ENGINE, help="float32, bfloat16 or float16 (default: float32 on CPU, bf16 on CUDA).")]
KvDtype = Annotated[Literal[KV_DTYPES], typer.Option(
    "--kv-dtype", rich_help_panel=_ENGINE,
    help="KV cache storage: 'auto' keeps the model's dtype, 'fp8' stores e4m3 with per-head scales (half the "
         "bytes of bf16; attention computes in float32 on the torch backend).")]
Precision = Annotated[Literal[PRECISIONS], typer.Option(
    "--precision", rich_help_panel=_ENGINE,
    help="'exact' (float32 on a CPU, token-exact against transformers; with AVX2, FMA and a C compiler one "
         "request's decode steps run as one C call); 'fast' picks reduced-precision weights this CPU runs faster "
         "(int8 weights for that C call; with AMX, bf16 linears for prefill and batches) or says why it "
         "keeps float32; 'int8' forces int8 weights on a CPU.")]
Verbose = Annotated[bool, typer.Option(
    "--verbose", metavar=FLAG, rich_help_panel=_ENGINE,
    help="Describe the engine's plan on stderr once it is ready: attention, kernels, weight formats, graphs.")]
Chat = Annotated[bool, typer.Option("--chat", metavar=FLAG, rich_help_panel=_ENGINE,
                                    help="Wrap each text prompt in the model's chat template as a user turn.")]

MaxTokens = Annotated[Optional[int], typer.Option(
    "--max-tokens", "-n", min=1, rich_help_panel=_SAMPLING,
    help="Tokens to generate per prompt (default: the file's value, else 16).")]
Temperature = Annotated[Optional[float], typer.Option(
    "--temperature", "-t", min=0.0, rich_help_panel=_SAMPLING, help="0 is greedy (default: 0).")]
TopK = Annotated[Optional[int], typer.Option("--top-k", rich_help_panel=_SAMPLING,
                                             help="Sample from the k most likely tokens; -1 is off (default: -1).")]
TopP = Annotated[Optional[float], typer.Option("--top-p", rich_help_panel=_SAMPLING,
                                               help="Nucleus sampling, in (0, 1] (default: 1).")]
Seed = Annotated[Optional[int], typer.Option("--seed", rich_help_panel=_SAMPLING,
                                             help="Seed for sampling (per request: same seed, same output).")]
IgnoreEos = Annotated[Optional[bool], typer.Option(
    "--ignore-eos/--stop-at-eos", metavar=FLAG, rich_help_panel=_SAMPLING, show_default=False,
    help="Keep generating after an end-of-sequence token (default: the file's value, else stop).")]
Stop = Annotated[Optional[list[str]], typer.Option(
    "--stop", metavar="TEXT", rich_help_panel=_SAMPLING, show_default=False,
    help="End a prompt's text at this string (cut before it); repeat for several.")]
Logprobs = Annotated[Optional[int], typer.Option(
    "--logprobs", min=0, max=20, rich_help_panel=_SAMPLING,
    help="With --json: each token's logprob and the N most likely alternatives.")]

Prompts = Annotated[Path, typer.Argument(
    metavar="PROMPTS", show_default=False,
    help="A .txt file (one prompt a line) or .jsonl file (objects with \"prompt\" or \"input_ids\" and optional "
         "max_tokens, temperature, top_k, top_p, seed, ignore_eos); '-' reads stdin.")]
OptionalPrompts = Annotated[Optional[Path], typer.Argument(
    metavar="PROMPTS", show_default=False,
    help="A .txt or .jsonl prompts file, or '-' for stdin. Default: the tutorial's five prompts "
         "(sample_prompts/chapter.jsonl).")]
Stream = Annotated[Optional[bool], typer.Option(
    "--stream/--no-stream", metavar=FLAG, show_default=False,
    help="Write each continuation as its tokens are produced (default: on a terminal with a single prompt).")]
Json = Annotated[bool, typer.Option("--json", metavar=FLAG, help="Print one JSON object per prompt instead of tables.")]


@dataclass(frozen=True)
class EngineOptions:
    model: str | None = None
    cache: str = DEFAULT_CACHE
    page_size: int = DEFAULT_PAGE_SIZE
    max_running: int = DEFAULT_MAX_RUNNING
    num_pages: int | None = None
    chat: bool = False
    attention: str | None = None
    cuda_graph_max_bs: int | None = None
    tp: int = 1
    dtype: str | None = None
    kv_dtype: str = "auto"
    precision: str = "exact"
    verbose: bool = False


@dataclass(frozen=True)
class SamplingOptions:
    max_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    ignore_eos: bool | None = None
    stop: tuple[str, ...] | None = None
    logprobs: int | None = None

    def explicit(self) -> dict[str, Any]:
        """Only the options that were given, by SamplingParams field name."""
        return {key: value for key, value in asdict(self).items() if value is not None and value != ()}
