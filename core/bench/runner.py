"""One benchmark run: the workload, the engine, the baselines and the matmul ceiling, in one process.

Everything is measured in the same run because the machines are shared and noisy: only ratios between runs
made side by side mean much.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, replace
from typing import Callable, Sequence, TypeVar

import torch

from core.bench.engine_run import batch1_request, run_batch1, run_engine, warm_up
from core.bench.floor import ModelCosts, batch1_floor_ms, measure_ceilings, workload_floor
from core.kernels.cpu.decode import SCREEN_BYTES_PER_WEIGHT, FourBitRows
from core.kernels.cpu.gemm import four_bit_panels
from core.kernels.cpu.four_bit import BYTES_PER_WEIGHT as FOUR_BIT_BYTES
from core.bench.flops import workload_flops
from core.bench.names import BASELINES, CUDA_BASELINES, parse_baselines
from core.bench.hf import hf_continuous, hf_sequential, hf_static, load_hf_model
from core.bench.report import BenchReport, Latency, ProgressFn, RunResult, no_progress
from core.bench.workload import BenchRequest, Workload, make_workload, workload_spec
from core.config import EngineConfig
from core.cpu_share import CpuTimes, other_load
from core.engine.engine import pick_device
from core.errors import InvalidParamsError
from core.llm import LLM
from core.model_config import ModelConfig
from core.models.loader import read_model_config
from core.models.weights import DEFAULT_MODEL_NAME, resolve_model_dir
from core.words import plural

# transformers' steps on a GPU are bound by its host work, whatever the batch: each baseline gets
# this long there by default and its throughput is measured over the tokens it made in that time
CUDA_BASELINE_SECONDS = 45.0
# the engine's KV page on CUDA unless asked: flashinfer's decode reads a head-major pool's large pages faster
# than pages of 16 or 1 (docs/BENCHMARKS.md); a CPU keeps the engine's default
CUDA_PAGE_SIZE = 128
T = TypeVar("T")


@dataclass(frozen=True)
class BenchOptions:
    workload: str | None = None  # None: 'cpu' without CUDA, else 'nanovllm'
    model: str | None = None  # None: the embedded SmolLM2-135M
    requests: int | None = None  # None: the workload's own count
    seed: int = 0
    skip_baselines: bool = False
    device: str | None = None
    threads: int | None = None  # torch intra-op threads for the whole run (engine, baselines and ceiling alike)
    tp: int = 1  # tensor-parallel ranks for the engine (the baselines run on one device)
    kv_dtype: str | None = None  # the engine's KV cache: None or 'auto' (the model's dtype), 'fp8'
    hf_requests: int | None = None  # the baselines run on the first N requests only; None: all of them
    # names from BASELINES, as a list or comma-separated; None: all of them on a CPU, CUDA_BASELINES on CUDA
    baselines: str | Sequence[str] | None = None
    # each baseline stops after this long, its tokens/s measured on what it made; None: CUDA_BASELINE_SECONDS
    # on CUDA, no limit on a CPU
    baseline_seconds: float | None = None
    # the engine's precision (core/config.py); other than 'exact', the exact engine runs first in the same run
    # as 'minisgl exact', so the two compare side by side
    precision: str = "exact"
    page_size: int | None = None  # the engine's KV page; None: CUDA_PAGE_SIZE on CUDA, the engine's default else
    admission: str = "estimate"  # the engine's admission rule (core/config.py)

    def workload_name(self) -> str:
        if self.workload is not None:
            return self.workload
        return "nanovllm" if torch.cuda.is_available() else "cpu"

    def engine_page_size(self) -> int:
        if self.page_size is not None:
            return self.page_size
        return CUDA_PAGE_SIZE if pick_device(self.device).type == "cuda" else EngineConfig.page_size


def run_bench(options: BenchOptions, progress: ProgressFn = no_progress,
              warn: Callable[[str], None] = lambda message: None,
              log: Callable[[str], None] | None = None,
              measured: Callable[[RunResult], None] = lambda result: None) -> BenchReport:
    """Run the engine (after a warm-up run), then one request alone for the batch-1 decode latency, then
    (unless skipped) each chosen baseline on the same requests, then the device's ceilings and the workload's
    floor on them; ``warn`` hears why a baseline could not run, ``log`` what the run is doing as each phase
    starts (loading, converting a GGUF, warming up, measuring); ``measured`` hears each run's result as soon as it is
    measured, so a run stopped with Ctrl-C still has the figures of the parts that finished."""
    say = log or (lambda message: None)
    spec = workload_spec(options.workload_name())
    if options.threads is not None:
        if isinstance(options.threads, bool) or not isinstance(options.threads, int) or options.threads < 1:
            raise InvalidParamsError(f"threads must be an integer >= 1, got {options.threads!r}")
        torch.set_num_threads(options.threads)
    if options.requests is not None and (isinstance(options.requests, bool) or not isinstance(options.requests, int)
                                         or options.requests < 1):
        raise InvalidParamsError(f"requests must be an integer >= 1, got {options.requests!r}")
    if options.hf_requests is not None and (isinstance(options.hf_requests, bool)
                                            or not isinstance(options.hf_requests, int) or options.hf_requests < 1):
        raise InvalidParamsError(f"hf_requests must be an integer >= 1, got {options.hf_requests!r}")
    chosen = parse_baselines(options.baselines)
    cfg = read_model_config(resolve_model_dir(options.model, log))
    model_name = options.model or DEFAULT_MODEL_NAME
    workload = make_workload(spec, cfg.vocab_size, options.seed, options.requests, cfg.max_position_embeddings)
    batch1 = batch1_request(workload, cfg.max_position_embeddings)
    longest = max(len(r.prompt_ids) + r.max_tokens for r in workload.requests + [batch1])

    def engine(precision: str) -> LLM:
        say(f"loading {model_name} into the engine (precision {precision})")
        llm = LLM(options.model, device=options.device, max_running_req=min(len(workload.requests), 256),
                  max_seq_len=longest, tp=options.tp, threads=options.threads, kv_dtype=options.kv_dtype or "auto",
                  precision=precision, page_size=options.engine_page_size(), admission=options.admission, log=log)
        say(llm.engine.describe())  # what the engine chose, in detail: what the figures are of
        return llm

    exact_result, exact_batch1_ms = None, None
    if options.precision != "exact":
        with engine("exact") as exact:
            exact_result, _, exact_batch1_ms = _time_engine(exact, workload, batch1, progress, say)
        del exact  # its weights and KV pool go before the next engine loads
        gc.collect()
        exact_result = replace(exact_result, name="minisgl exact")
        measured(exact_result)
    llm = engine(options.precision)
    engine_result, latency, batch1_ms = _time_engine(llm, workload, batch1, progress, say)
    measured(engine_result)
    results = [engine_result] + ([exact_result] if exact_result else [])
    skipped: dict[str, str] = {}
    if not options.skip_baselines:
        say("loading the model into transformers for the baselines")
        seconds = options.baseline_seconds
        if seconds is None and llm.device.type == "cuda":
            seconds = CUDA_BASELINE_SECONDS
        results += _run_baselines(llm, _first(workload, options.hf_requests), chosen or default_baselines(llm.device),
                                  progress, skipped, warn, say, seconds, measured)
    say("measuring the device's memory bandwidth and matmul rate")
    ceilings = measure_ceilings(llm.device, llm.engine.dtype)
    costs = ModelCosts.of(cfg, _body_bytes(llm), llm.engine.kv_bytes_per_token, options.tp,
                          head_elem_bytes=llm.engine.dtype.itemsize)
    batch1_costs = _batch1_costs(llm, cfg, costs, options.tp)
    return BenchReport(
        workload=spec.name, model=model_name, device=_describe(llm.device), requests=len(workload.requests),
        prompt_tokens=workload.prompt_tokens, results=results, latency=latency,
        matmul_gflops=ceilings.matmul_gflops, model_gflop=workload_flops(cfg, workload) / 1e9, skipped=skipped,
        batch1_ms_per_token=batch1_ms, copy_gbps=ceilings.copy_gbps, read_gbps=ceilings.read_gbps,
        floor=workload_floor(costs, workload.requests, ceilings),
        batch1_floor_ms=batch1_floor_ms(batch1_costs, batch1, ceilings), precision=options.precision,
        precision_note=llm.precision_note, exact_batch1_ms_per_token=exact_batch1_ms,
        page_size=llm.engine.page_size)


def _body_bytes(llm: LLM, one_request: bool = False) -> float:
    """Bytes per decoder weight the engine reads (``one_request``: its C decode step does): its float32 linears'
    4-bit codes where its C kernels hold them (core/kernels/cpu/four_bit.py: the same floats, so the work costs only
    those bytes), else its dtype's size."""
    engine = llm.engine
    step = engine.cpu_paths.decode_step
    four_bit = (step is not None and isinstance(step.layers_kept[0].qkv, FourBitRows) if one_request
                else four_bit_panels(engine.model) > 0)
    return FOUR_BIT_BYTES if four_bit else engine.dtype.itemsize


def _batch1_costs(llm: LLM, cfg: ModelConfig, costs: ModelCosts, tp: int) -> ModelCosts:
    """What one request's decode step reads: under int8 that is int8 weights even where batches keep float32
    ones (the C step reads int8 copies, its LM head too; torch's int8 layers keep a float32 head); the float32 C
    step screens the greedy batch-1 request's LM head through its int8 copy (the few rows it keeps are not counted)."""
    precision = llm.engine.plan.precision
    if precision.c_decode and not precision.c_int8:
        return ModelCosts.of(cfg, _body_bytes(llm, one_request=True), llm.engine.kv_bytes_per_token, tp,
                             head_elem_bytes=SCREEN_BYTES_PER_WEIGHT)
    if not (precision.c_int8 or precision.int8_weights):
        return costs
    head_bytes = 1 if precision.c_int8 else llm.engine.dtype.itemsize
    return ModelCosts.of(cfg, 1, llm.engine.kv_bytes_per_token, tp, head_elem_bytes=head_bytes)


def _time_engine(llm: LLM, workload: Workload, batch1: BenchRequest, progress: ProgressFn,
                 say: Callable[[str], None]) -> tuple[RunResult, Latency, float | None]:
    """The workload after a warm-up run, then the batch-1 request alone."""
    say(f"warming up the engine: the {plural(len(workload.requests), 'request')} cut to a few tokens each")
    warm_up(llm, workload)
    result, latency = metered(lambda: run_engine(llm, workload, progress))
    say("timing batch-1 decode: one request alone")
    return result, latency, run_batch1(llm, batch1)


def metered(run: Callable[[], tuple[RunResult, T]]) -> tuple[RunResult, T]:
    """``run``'s result with what other processes used of our CPUs while it ran (RunResult.others)."""
    start = CpuTimes.now()
    result, latency = run()
    return replace(result, others=other_load(start, CpuTimes.now())), latency


def default_baselines(device: torch.device) -> tuple[str, ...]:
    return CUDA_BASELINES if device.type == "cuda" else BASELINES


def _first(workload: Workload, count: int | None) -> Workload:
    """The workload cut to its first ``count`` requests: transformers' static batch of all 256 GPU requests
    would take long, and its throughput on a prefix of the same requests is what the ratio needs."""
    if count is None or count >= len(workload.requests):
        return workload
    return replace(workload, requests=workload.requests[:count])


def _run_baselines(llm: LLM, workload: Workload, names: Sequence[str], progress: ProgressFn,
                   skipped: dict[str, str], warn: Callable[[str], None], note: Callable[[str], None],
                   seconds: float | None, measured: Callable[[RunResult], None]) -> list:
    # for a random spec, the weights of a one-rank engine from the same spec (the engine's own when tp == 1)
    model = load_hf_model(llm.model_dir, llm.device, llm.engine.dtype)
    _warm_up_hf(model)
    runs = {"hf-sequential": hf_sequential, "hf-static": hf_static, "hf-continuous": hf_continuous}
    results = []
    for name in names:
        limit = f", at most {seconds:.0f} s" if seconds is not None else ""
        note(f"bench: {name} on {plural(len(workload.requests), 'request')}{limit}")
        try:
            results.append(metered(lambda: (runs[name](model, workload, progress, seconds), None))[0])
            measured(results[-1])
        except Exception as exc:  # a baseline that cannot run here is reported, never fatal
            skipped[name] = f"{type(exc).__name__}: {exc}"
            warn(f"{name} left out: {skipped[name]}")
    return results


def _warm_up_hf(model) -> None:
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]], device=model.device)
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4,
                       do_sample=False, pad_token_id=0)


def _describe(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({plural(torch.get_num_threads(), 'thread')})"
