"""The whole GPU check in one process: kernel builds, GPU tests, correctness on the real shape, benchmarks.

Run through scripts/gpu_check.sh on a CUDA machine. Every step is guarded: a failure is recorded with its
reason and the next step still runs; a step that would not fit in the time left is skipped and says so. The
last thing printed is a summary table; everything (log, pytest output, figures as JSON) also goes to --out.

    python scripts/gpu_check.py --out out/gpu --budget 500     # on the GPU (gpu_env.sh puts the tree on the path)
    PYTHONPATH=. python scripts/gpu_check.py --smoke            # the same code path on a CPU, tiny model

The benchmarks are ``minisgl bench``'s own pieces (core/bench: the nanovllm workload, its warm-up, the timed
run, the percentile rule); what this script adds is the step runner, the kernel builds, the GPU tests, the
correctness checks on the real shape, step-level figures and a profile.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from core import LLM, SamplingParams
from core.bench.engine_run import batch1_request, run_engine, sampling_params, warm_up
from core.bench.report import no_progress, percentile
from core.bench.workload import Workload, make_workload, workload_spec

ROOT = Path(__file__).resolve().parents[1]  # where pytest runs and the commit is read


@dataclass
class Row:
    step: str
    status: str  # PASS, FAIL, SKIP, INFO
    detail: str
    seconds: float


@dataclass
class Check:
    out: Path
    deadline: float
    smoke: bool
    rows: list[Row] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def left(self) -> float:
        return self.deadline - time.time()

    def step(self, name: str, fn: Callable[[], tuple[str, str] | str], need_s: float = 0.0) -> None:
        """Run one step; it returns a detail (PASS) or (status, detail). Exceptions become FAIL rows."""
        if self.left() < need_s:
            self.rows.append(Row(name, "SKIP", f"needs ~{need_s:.0f}s, {max(self.left(), 0):.0f}s left", 0.0))
            print(f"== {name}: skipped (time)", flush=True)
            return
        print(f"== {name} ...", flush=True)
        start = time.time()
        try:
            result = fn()
            status, detail = result if isinstance(result, tuple) else ("PASS", result)
        except Exception as exc:  # noqa: BLE001 - one broken step must not hide the others
            traceback.print_exc()
            status, detail = "FAIL", f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        finally:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        row = Row(name, status, detail, time.time() - start)
        self.rows.append(row)
        print(f"== {name}: {status} ({row.seconds:.1f}s) {detail}", flush=True)
        # after every step: a crash later (a CUDA fault aborts the process) keeps what was measured
        (self.out / "figures.json").write_text(json.dumps(self.figures, indent=1, default=str))

    def table(self) -> str:
        width = max(len(r.step) for r in self.rows)
        lines = [f"{'step'.ljust(width)}  status  secs  detail", "-" * (width + 60)]
        lines += [f"{r.step.ljust(width)}  {r.status.ljust(6)}  {r.seconds:4.0f}  {r.detail}" for r in self.rows]
        return "\n".join(lines)


def _model(check: Check) -> str:
    """The model every step runs: the Qwen3-0.6B shape with random weights, or a tiny one with --smoke."""
    return "random:tiny-qwen3" if check.smoke else "random:qwen3-0.6b"


# ---- environment and kernel builds --------------------------------------------------------------------------
def env_info(check: Check) -> str:
    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    try:
        import flashinfer

        info["flashinfer"] = flashinfer.__version__
    except Exception as exc:  # noqa: BLE001
        info["flashinfer"] = f"missing ({type(exc).__name__})"
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except Exception:  # noqa: BLE001
        pass
    commit_file = ROOT / "COMMIT"  # a copy of the tree without .git (as sent to a lent GPU) names its commit here
    info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                    text=True).stdout.strip() or (commit_file.read_text().strip()
                                                                  if commit_file.exists() else "unknown")
    check.figures["env"] = info
    return ", ".join(f"{k} {v}" for k, v in info.items())


def warm_kernels(check: Check) -> str:
    """Build every flashinfer module the engine uses at once (each build is a separate ninja run, so in
    parallel they share the cores) and compile the sampler, instead of paying for them one after another."""
    from core.kernels.cuda.attention.flashinfer_paged import FlashInferPagedBackend
    from core.kernels.dispatch import FlashInferKernels
    from core.layers.rope import RotaryEmbedding
    from core.model_config import RopeScaling

    dev = torch.device("cuda")
    x = torch.randn(4, 1024, dtype=torch.bfloat16, device=dev)
    w = torch.ones(1024, dtype=torch.bfloat16, device=dev)

    def attention(phase: str) -> None:
        from core.kvcache.pool import KVPool
        from core.request import Batch, Req

        pool = KVPool(1, 8, 16, 8, 128, torch.bfloat16, dev)
        table = torch.arange(64, device=dev).repeat(2, 1)
        backend = FlashInferPagedBackend(pool, table, 16, 8, 128)
        req = Req(uid=0, input_ids=[0] * 5, prompt_len=5, table_idx=0, cached_len=0 if phase == "prefill" else 4,
                  device_len=5, max_device_len=9, params=SamplingParams(), sample_seed=0)
        n = req.extend_len
        batch = Batch([req], phase, positions=torch.arange(5 - n, 5, device=dev),
                      out_loc=torch.arange(5 - n, 5, device=dev))
        backend.prepare_metadata(batch)
        backend.begin_forward(batch)
        q = torch.randn(n, 16, 128, dtype=torch.bfloat16, device=dev)
        kv = torch.randn(n, 8, 128, dtype=torch.bfloat16, device=dev)
        backend.forward(q, kv, kv, 0, batch)

    def rope() -> None:
        r = RotaryEmbedding(128, 64, 1e6, RopeScaling()).to(dev)
        q = torch.randn(4, 16, 128, dtype=torch.bfloat16, device=dev)
        FlashInferKernels.rope(torch.arange(4, device=dev), q, q[:, :8].clone(), r.cos, r.sin, r.cos_sin)

    jobs = {"prefill": lambda: attention("prefill"), "decode": lambda: attention("decode"),
            "norm": lambda: (FlashInferKernels.rms_norm(x, w, 1e-6),
                             FlashInferKernels.add_rms_norm(x.clone(), x.clone(), w, 1e-6)),
            "silu": lambda: FlashInferKernels.silu_and_mul(x), "rope": rope}
    times: dict[str, str] = {}

    def run(name: str, fn: Callable) -> None:
        start = time.time()
        try:
            fn()
            torch.cuda.synchronize()
            times[name] = f"{time.time() - start:.0f}s"
        except Exception as exc:  # noqa: BLE001
            times[name] = f"FAILED {type(exc).__name__}: {str(exc)[:120]}"
            traceback.print_exc()

    threads = [threading.Thread(target=run, args=item) for item in jobs.items()]
    for t in threads:
        t.start()
    run("sampler-compile", _warm_sampler)  # dynamo in the main thread while ninja builds run
    for t in threads:
        t.join()
    detail = ", ".join(f"{k} {v}" for k, v in times.items())
    return ("FAIL" if "FAILED" in detail else "PASS"), detail


def _warm_sampler() -> None:
    from core.engine.sampler import Sampler, SampleArgs

    dev = torch.device("cuda")
    s = Sampler(dev)
    logits = torch.randn(3, 1000, device=dev)
    s.sample(logits, SampleArgs(temperatures=torch.ones(3, device=dev), top_k=torch.full((3,), -1, device=dev),
                                top_p=torch.ones(3, device=dev), seeds=torch.arange(3, device=dev),
                                positions=torch.arange(3, device=dev), greedy_rows=torch.zeros(3, dtype=torch.bool,
                                                                                                device=dev)))


# ---- tests ------------------------------------------------------------------------------------------------
def run_pytest(check: Check) -> tuple[str, str]:
    junit = Path("/tmp/minisgl-pytest.xml")
    # the GPU tests, and the Triton kernels' tests (which run on a CPU only under Triton's interpreter)
    kernel_tests = [f"tests/kernels/test_{name}.py" for name in ("fused_qkv", "gemv", "small_decode", "race",
                                                                   "gpu_screened_head")]
    cmd = [sys.executable, "-m", "pytest", "-q", "tests/gpu", *kernel_tests, f"--junitxml={junit}", "-p",
           "no:cacheprovider"]
    timeout = max(check.left() - 240, 60)  # leave the benchmarks their time
    with open(check.out / "pytest.log", "w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    tail = (check.out / "pytest.log").read_text().strip().splitlines()
    summary = tail[-1] if tail else "no output"
    for row in _junit_rows(junit):
        check.rows.append(row)
    return ("PASS" if proc.returncode == 0 else "FAIL"), summary


def _junit_rows(path: Path) -> list[Row]:
    import xml.etree.ElementTree as ET

    if not path.exists():
        return []
    rows = []
    for case in ET.parse(path).iter("testcase"):
        name = "  " + case.get("name", "?")
        status, detail = "PASS", ""
        for tag, label in (("failure", "FAIL"), ("error", "FAIL"), ("skipped", "SKIP")):
            node = case.find(tag)
            if node is not None:
                status, detail = label, (node.get("message") or "").splitlines()[0][:160] if node.get("message") else ""
        rows.append(Row(name, status, detail, float(case.get("time", 0))))
    return rows


# ---- correctness on the real shape ---------------------------------------------------------------------------
def backends_agree_on_real_shape(check: Check) -> tuple[str, str]:
    from core.bench.reference import near_tie_compare

    rng = random.Random(1)
    model = _model(check)
    prompts = [[rng.randrange(10000 if not check.smoke else 256) for _ in range(rng.randint(20, 300))]
               for _ in range(12)]
    lengths = [rng.randint(8, 48) for _ in prompts]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    common = dict(max_running_req=8, page_size=16, max_seq_len=1024, kv_cache_gb=4.0)
    ref = LLM(model, attention="torch", cuda_graph_max_bs=0, **common)
    if check.smoke:
        fast = LLM(model, attention="torch", cuda_graph_max_bs=0, **common)
    else:
        fast = LLM(model, attention="flashinfer", **common)  # graphs on, fused kernels
    outs_ref = [r["token_ids"] for r in ref.generate(prompts, params)]
    outs_fast = [r["token_ids"] for r in fast.generate(prompts, params)]
    verdict = near_tie_compare(ref, fast, prompts, outs_ref, outs_fast)
    check.figures["real_shape_agreement"] = {"verdict": str(verdict), "details": verdict.details}
    return ("PASS" if verdict.ok else "FAIL"), f"torch vs flashinfer+graphs, {model}, bf16: {verdict}"


def overlap_agrees_on_real_shape(check: Check) -> tuple[str, str]:
    """The overlap loop against the plain loop on one flashinfer engine with graphs, queueing included."""
    from core.bench.reference import near_tie_compare

    rng = random.Random(2)
    model = _model(check)
    prompts = [[rng.randrange(10000 if not check.smoke else 256) for _ in range(rng.randint(20, 300))]
               for _ in range(24)]
    params = [SamplingParams(max_tokens=rng.randint(8, 64), ignore_eos=True) for _ in prompts]
    llm = LLM(model, max_running_req=8, page_size=16, max_seq_len=1024, kv_cache_gb=4.0, max_extend_tokens=512)
    llm.overlap = False
    plain = [r["token_ids"] for r in llm.generate(prompts, params)]
    llm.overlap = True
    over = [r["token_ids"] for r in llm.generate(prompts, params)]
    verdict = near_tie_compare(llm, llm, prompts, plain, over)
    stats = llm.stats()
    leaks = stats["free_rows"] != stats["total_rows"] or stats["free_pages"] + stats["cached_pages"] != stats["total_pages"]
    check.figures["overlap_agreement"] = {"verdict": str(verdict), "details": verdict.details, "stats": stats}
    ok = verdict.ok and not leaks
    return ("PASS" if ok else "FAIL"), f"overlap on vs off, {model}, 24 requests over 8 rows: {verdict}" + \
        (", rows or pages leaked" if leaks else ", no leak")


def profile_host(check: Check, state: BenchState) -> str:
    """Where the host's time goes per step (cProfile), at batch 1 and at batch 256: written to
    host_profile.txt, the top entries printed."""
    import cProfile
    import io
    import pstats

    llm = state.llm
    if llm is None:
        return "SKIP", "no engine"
    llm.overlap = True
    rng = random.Random(4)
    vocab = min(10000, llm.vocab_size)
    out = io.StringIO()
    summary = []
    for name, prompts, params in (
            ("batch 1, 200 tokens", [[rng.randrange(vocab) for _ in range(128)]],
             [SamplingParams(max_tokens=200, ignore_eos=True)]),
            ("batch 256, 24 tokens, temperature 0.6", [[rng.randrange(vocab) for _ in range(100)] for _ in range(256)],
             [SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.6)] * 256)):
        steps: list = []
        llm.add_step_callback(steps.append)
        profile = cProfile.Profile()
        profile.enable()
        llm.generate(prompts, params)
        profile.disable()
        llm.scheduler.step_callbacks.remove(steps.append)
        decode = [e.elapsed_s for e in steps if e.phase == "decode"]
        per_step = percentile(decode, 0.5) * 1e3 if decode else float("nan")
        summary.append(f"{name}: {per_step:.2f} ms/step under the profiler")
        out.write(f"==== {name}: {len(decode)} decode steps, median {per_step:.2f} ms under the profiler\n")
        stats = pstats.Stats(profile, stream=out)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(30)
    (check.out / "host_profile.txt").write_text(out.getvalue())
    print(out.getvalue()[:6000])
    return "; ".join(summary)


# ---- benchmarks ----------------------------------------------------------------------------------------------
def nanovllm_workload(smoke: bool, vocab_size: int) -> Workload:
    """``minisgl bench``'s nanovllm workload (256 requests, lengths in [100, 1024], temperature 0.6, seed 0);
    with --smoke, 8 short requests over the tiny model's ids."""
    spec = workload_spec("nanovllm")
    if smoke:
        spec = replace(spec, num_requests=8, prompt_len=(10, 40), max_tokens=(10, 40), token_id_limit=256)
    return make_workload(spec, vocab_size)


def _summary(values: list[float], scale: float = 1.0) -> dict[str, float]:
    """p50, p90, p99 and mean by core/bench's one percentile rule (the same as ``minisgl bench``)."""
    if not values:
        return {}
    return {"p50": percentile(values, 0.5) * scale, "p90": percentile(values, 0.9) * scale,
            "p99": percentile(values, 0.99) * scale, "mean": sum(values) / len(values) * scale}


class BenchState:
    llm: LLM | None = None


def bench_engine(check: Check, state: BenchState, page_size: int, overlap: bool = True,
                 max_warmup_step_ms: float | None = None) -> str | tuple[str, str]:
    """The nanovllm workload on one engine, warmed up and timed as ``minisgl bench`` does; ``overlap=False``
    runs the same engine with the plain loop. With ``max_warmup_step_ms``, a probe slower than that per decode
    step skips the measurement (it would not finish in the time left)."""
    if state.llm is None or state.llm.config.page_size != page_size:
        state.llm = None
        gc.collect()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        start = time.time()
        max_seq_len = 512 if check.smoke else 2 * workload_spec("nanovllm").max_tokens[1] + 8
        n = 8 if check.smoke else workload_spec("nanovllm").num_requests
        state.llm = LLM(_model(check), max_running_req=n, page_size=page_size, max_seq_len=max_seq_len, log=print)
        check.figures[f"engine_start_s_ps{page_size}"] = round(time.time() - start, 1)
    llm = state.llm
    llm.overlap = overlap and (torch.cuda.is_available() or check.smoke)
    workload = nanovllm_workload(check.smoke, llm.vocab_size)
    if max_warmup_step_ms is not None:  # a short probe at batch 16 first: is a full run affordable at all?
        probe: list = []
        llm.add_step_callback(probe.append)
        llm.generate([r.prompt_ids for r in workload.requests[:16]],
                     [replace(p, max_tokens=32) for p in sampling_params(workload)[:16]])
        llm.scheduler.step_callbacks.remove(probe.append)
        probe_ms = percentile([e.elapsed_s for e in probe if e.phase == "decode"], 0.5) * 1e3
        if probe_ms > max_warmup_step_ms:
            return "SKIP", (f"warm-up decode step {probe_ms:.1f} ms at batch 16 (> {max_warmup_step_ms} ms): "
                            "too slow to run")
    warm_up(llm, workload)
    steps: list = []
    llm.add_step_callback(steps.append)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    try:
        result, latency = run_engine(llm, workload, no_progress)
    finally:
        llm.scheduler.step_callbacks.remove(steps.append)
    total = workload.output_tokens
    assert result.output_tokens == total, f"produced {result.output_tokens} tokens, expected {total}"
    decode_steps = [e for e in steps if e.phase == "decode"]
    prefill_steps = [e for e in steps if e.phase == "prefill"]
    fig = {"requests": len(workload.requests), "output_tokens": total, "prompt_tokens": workload.prompt_tokens,
           "wall_s": round(result.wall_s, 3), "tok_per_s": round(result.output_tokens_per_s, 1),
           "ttft_s": latency.ttft.to_dict(), "tpot_ms": {k: v * 1e3 for k, v in latency.tpot.to_dict().items()},
           "decode_steps": len(decode_steps), "prefill_steps": len(prefill_steps),
           "decode_step_ms": _summary([e.elapsed_s for e in decode_steps], 1e3),
           "prefill_time_s": round(sum(e.elapsed_s for e in prefill_steps), 3),
           "decode_time_s": round(sum(e.elapsed_s for e in decode_steps), 3),
           "peak_batch": max((e.batch_size for e in decode_steps), default=0), "overlap": llm.overlap}
    check.figures[f"nanovllm_ps{page_size}" + ("" if overlap else "_plain")] = fig
    return (f"{fig['tok_per_s']:.0f} tok/s ({total} tok in {result.wall_s:.1f}s), "
            f"TTFT p50 {fig['ttft_s']['p50']:.2f}s, TPOT p50 {fig['tpot_ms'].get('p50', 0):.2f}ms, "
            f"decode step p50 {fig['decode_step_ms'].get('p50', 0):.2f}ms over {len(decode_steps)} steps, prefill {fig['prefill_time_s']:.1f}s")


BATCH1_TOKENS = 257


def bench_batch1(check: Check, state: BenchState, graphs: bool = True, overlap: bool = True) -> str:
    """Per-token latency of one request decoding alone (greedy), from the decode steps' wall times; the prompt
    is ``minisgl bench``'s batch-1 prompt (from the workload's own ids)."""
    if graphs and state.llm is not None:
        llm = state.llm
    else:
        llm = LLM(_model(check), max_running_req=1, page_size=16, max_seq_len=1024, kv_cache_gb=2.0,
                  cuda_graph_max_bs=None if graphs else 0)
    llm.overlap = overlap and (torch.cuda.is_available() or check.smoke)
    prompt = batch1_request(nanovllm_workload(check.smoke, llm.vocab_size), 1024).prompt_ids
    steps: list = []
    llm.generate([prompt], SamplingParams(max_tokens=16, ignore_eos=True))  # warm-up
    llm.add_step_callback(steps.append)
    start = time.perf_counter()
    out = llm.generate([prompt], SamplingParams(max_tokens=BATCH1_TOKENS, ignore_eos=True))[0]
    assert out["finish_reason"] == "length", out
    wall = time.perf_counter() - start
    llm.scheduler.step_callbacks.remove(steps.append)
    decode = _summary([e.elapsed_s for e in steps if e.phase == "decode"], 1e3)
    key = "batch1" + ("" if graphs else "_eager") + ("" if overlap else "_plain")
    check.figures[key] = {"median_ms_per_token": round(decode["p50"], 3), "p90_ms": round(decode["p90"], 3),
                          "tokens": BATCH1_TOKENS, "wall_s": round(wall, 3), "overlap": llm.overlap}
    return (f"median {decode['p50']:.3f} ms/token (p90 {decode['p90']:.3f}), {BATCH1_TOKENS} tokens in "
            f"{wall:.2f}s")


def bench_transformers(check: Check, state: BenchState, n: int) -> str:
    """transformers' static batched generate (padded) on the first n requests of the same workload, with the
    engine's very weights: ``minisgl bench``'s hf-static baseline."""
    from core.bench.hf import hf_static, load_hf_model
    from core.models.weights import resolve_model_dir

    state.llm = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = load_hf_model(resolve_model_dir(_model(check)), device, dtype)
    workload = nanovllm_workload(check.smoke, model.config.vocab_size)
    workload = replace(workload, requests=workload.requests[:n])
    n = len(workload.requests)
    steps = max(r.max_tokens for r in workload.requests)
    result = hf_static(model, workload, no_progress, seconds=max(min(check.left() - 30, 45), 10))
    cut = result.output_tokens < workload.output_tokens
    fig = {"requests": n, "useful_tokens": result.output_tokens, "of_steps": steps, "wall_s": round(result.wall_s, 3),
           "tok_per_s": round(result.output_tokens_per_s, 1), "cut_by_max_time": cut}
    check.figures["transformers_static"] = fig
    engine = check.figures.get("nanovllm_ps16") or check.figures.get("nanovllm_ps1")
    ratio = f", engine/transformers {engine['tok_per_s'] / fig['tok_per_s']:.1f}x" if engine else ""
    return f"{fig['tok_per_s']:.0f} tok/s on {n} requests{' (stopped by max_time)' if cut else ''}{ratio}"


def headline(fig: dict[str, Any]) -> str:
    """The figures that matter, on one line each, against the targets."""
    lines = [f"device: {fig.get('env', {}).get('device')}, commit {fig.get('env', {}).get('commit')}"]
    for key in ("nanovllm_ps16", "nanovllm_ps16_plain", "nanovllm_ps1"):
        if key in fig:
            f = fig[key]
            lines.append(f"{key}: {f['tok_per_s']:.0f} tok/s (target >= 20000), wall {f['wall_s']}s, "
                         f"decode {f['decode_time_s']}s over {f['decode_steps']} steps, prefill {f['prefill_time_s']}s")
    for key in ("batch1", "batch1_plain", "batch1_eager"):
        if key in fig:
            lines.append(f"{key}: {fig[key]['median_ms_per_token']} ms/token (target <= 1.0)")
    if "transformers_static" in fig:
        lines.append(f"transformers static: {fig['transformers_static']['tok_per_s']} tok/s")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "out" / "gpu"))
    parser.add_argument("--budget", type=float, default=520.0, help="seconds for the whole check")
    parser.add_argument("--hf-requests", type=int, default=16)
    parser.add_argument("--smoke", action="store_true", help="run the same steps on a CPU with a tiny model")
    parser.add_argument("--skip-pytest", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    check = Check(out, time.time() + args.budget, args.smoke)
    gpu = torch.cuda.is_available()
    check.step("environment", lambda: env_info(check))
    if not gpu and not args.smoke:
        check.rows.append(Row("cuda", "FAIL", "no CUDA device; use --smoke for a CPU dry run", 0))
    else:
        if gpu:
            check.step("build flashinfer kernels + compile sampler", lambda: warm_kernels(check), need_s=60)
            if not args.skip_pytest:
                check.step("pytest tests/gpu + kernel tests", lambda: run_pytest(check), need_s=150)
        check.step("torch vs flashinfer, real shape", lambda: backends_agree_on_real_shape(check), need_s=60)
        check.step("overlap on vs off, real shape", lambda: overlap_agrees_on_real_shape(check), need_s=40)
        state = BenchState()
        check.step("bench nanovllm, page 16", lambda: bench_engine(check, state, 16), need_s=60)
        check.step("bench nanovllm, page 16, overlap off", lambda: bench_engine(check, state, 16, overlap=False),
                   need_s=45)
        check.step("bench batch-1 decode, graphs", lambda: bench_batch1(check, state, True), need_s=15)
        check.step("bench batch-1 decode, graphs, overlap off", lambda: bench_batch1(check, state, True, False),
                   need_s=15)
        check.step("bench batch-1 decode, eager", lambda: bench_batch1(check, BenchState(), False), need_s=40)
        if gpu:
            check.step("profile host work per step", lambda: profile_host(check, state), need_s=40)
        check.step("bench nanovllm, page 1",
                   lambda: bench_engine(check, state, 1, max_warmup_step_ms=None if check.smoke else 15.0),
                   need_s=100)
        check.step(f"transformers static generate, {args.hf_requests} req",
                   lambda: bench_transformers(check, state, args.hf_requests), need_s=60)
    (out / "figures.json").write_text(json.dumps(check.figures, indent=1, default=str))
    table = check.table()
    print("\n" + table)
    print("\n" + headline(check.figures))
    return 1 if any(r.status == "FAIL" for r in check.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
