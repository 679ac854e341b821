"""``minisgl bench``: the command completes on a tiny model and reports every figure, and with its output piped
says on stderr what it is doing; no timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from core.bench.engine_run import batch1_request, run_batch1, run_engine, warm_up
from core.bench.flops import body_params, workload_flops
from core.bench.report import BenchReport, Latency, Percentiles, RunResult
from core.bench.runner import BASELINES, CUDA_BASELINES, default_baselines, parse_baselines
from core.bench.workload import BenchRequest, Workload, make_workload, workload_spec
from core.errors import InvalidParamsError
from core.models.loader import read_model_config
from minisgl_cli.app import app

runner = CliRunner()


@pytest.fixture(scope="module")
def piped_bench(model_dirs) -> subprocess.CompletedProcess:
    """One whole ``minisgl bench --json`` as a process whose output is piped, every baseline and the ceilings
    measured: its report and what it says on stderr are read by the two tests below."""
    done = subprocess.run([sys.executable, "-m", "minisgl_cli", "bench", "--model", model_dirs["llama"],
                           "--requests", "4", "--json", "--threads", "1"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture
def given_ceilings(monkeypatch) -> None:
    """For a run whose assertions are not about the floor: the device's bandwidth and matmul rate as given figures
    instead of measured for seconds (piped_bench measures them)."""
    from core.bench import runner
    from core.bench.floor import Ceilings

    monkeypatch.setattr(runner, "measure_ceilings", lambda device, dtype: Ceilings(20.0, 100.0, 30.0))


def test_bench_json_reports_engine_and_every_baseline(piped_bench, model_dirs):
    report = json.loads(piped_bench.stdout)  # stdout holds only the report
    assert {"workload", "model", "device", "requests", "results", "matmul_gflops",
            "model_flops_fraction"} <= set(report)
    assert report["workload"] == "cpu" and report["requests"] == 4 and report["model"] == model_dirs["llama"]
    names = [r["name"] for r in report["results"]]
    assert names[0] == "minisgl"
    # every baseline either ran or says why it did not
    assert set(names[1:]) | set(report["skipped"]) == {"hf-sequential", "hf-static", "hf-continuous"}
    assert {"hf-sequential", "hf-static"} <= set(names)
    expected = make_workload(workload_spec("cpu"), 320, seed=0, num_requests=4).output_tokens
    for r in report["results"]:
        assert set(r) == {"name", "wall_s", "output_tokens", "output_tokens_per_s", "requests", "others_cpus", "busy",
                          "preemptions"}
        assert (r["preemptions"] is None) == (r["name"] != "minisgl")  # the engine counts, the baselines have none
        assert r["others_cpus"] >= 0
        # busy is decided on the unrounded share: at the threshold itself, the report's two places cannot tell
        threshold = 0.1 * len(os.sched_getaffinity(0))
        if abs(r["others_cpus"] - threshold) > 0.005:
            assert r["busy"] == (r["others_cpus"] > threshold)
        assert r["requests"] == 4
        assert r["output_tokens"] == expected  # EOS ignored: each request makes exactly max_tokens
        assert r["wall_s"] > 0 and r["output_tokens_per_s"] > 0
    assert report["matmul_gflops"] > 0 and report["model_flops_fraction"] > 0
    assert report["latency"]["ttft_s"]["p50"] > 0 and report["latency"]["tpot_s"]["p99"] > 0
    assert report["batch1_ms_per_token"] > 0
    assert report["copy_gbps"] > 0 and report["read_gbps"] > 0 and report["floor"]["floor_s"] > 0  # a CPU: both
    assert 0 < report["floor_fraction"] < 1 and 0 < report["batch1_floor_fraction"] < 1


def test_piped_bench_says_what_it_is_doing(piped_bench, model_dirs):
    """stderr is no terminal: each phase says when it starts and ends, each counter in its units."""
    for phase in ("loading torch and the engine…", f"loading {model_dirs['llama']} into the engine",
                  "warming up the engine", "engine ready on cpu", "minisgl: ", " tokens in ",
                  "timing batch-1 decode", "loading the model into transformers", "hf-static: ", " steps in ",
                  "hf-continuous: ", " requests in ", "measuring the device's memory bandwidth and matmul rate"):
        assert phase in piped_bench.stderr, (phase, piped_bench.stderr)


def test_random_spec_baselines_run_on_the_first_hf_requests(given_ceilings):
    result = runner.invoke(app, ["bench", "--model", "random:tiny-qwen3", "--requests", "4", "--hf-requests", "2",
                                 "--json", "--threads", "1"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    by_name = {r["name"]: r for r in report["results"]}
    assert report["requests"] == 4 and by_name["minisgl"]["requests"] == 4
    workload = make_workload(workload_spec("cpu"), 320, seed=0, num_requests=4, max_seq_len=512)
    assert by_name["minisgl"]["output_tokens"] == workload.output_tokens
    assert by_name["hf-static"]["requests"] == 2
    assert by_name["hf-static"]["output_tokens"] == sum(r.max_tokens for r in workload.requests[:2])
    assert set(by_name) | set(report["skipped"]) == {"minisgl", "hf-sequential", "hf-static", "hf-continuous"}


def test_random_spec_hf_twin_decodes_the_engines_greedy_tokens():
    import torch

    from core import LLM, SamplingParams
    from core.bench.random_hf import random_hf_model
    from core.models.random_spec import parse_random_spec

    prompts = [[5, 17, 200, 33, 90, 1, 2], [300, 4, 4, 4, 8]]
    llm = LLM("random:tiny-qwen3", device="cpu")
    engine = [o["token_ids"] for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12,
                                                                            ignore_eos=True))]
    model = random_hf_model(parse_random_spec("random:tiny-qwen3"), torch.device("cpu"), torch.float32)
    for prompt, tokens in zip(prompts, engine):
        ids = torch.tensor([prompt])
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                             min_new_tokens=12, do_sample=False, pad_token_id=0)
        assert out[0, len(prompt):].tolist() == tokens


def test_baselines_option_runs_only_the_named_ones(given_ceilings):
    result = runner.invoke(app, ["bench", "--model", "random:tiny-qwen3", "--requests", "2", "--json",
                                 "--threads", "1", "--baselines", "hf-static"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [r["name"] for r in report["results"]] == ["minisgl", "hf-static"] and report["skipped"] == {}


def test_baselines_default_to_the_batched_ones_on_cuda():
    import torch

    assert default_baselines(torch.device("cpu")) == BASELINES
    assert default_baselines(torch.device("cuda", 0)) == CUDA_BASELINES == ("hf-static", "hf-continuous")
    assert parse_baselines(None) is None
    assert parse_baselines(" hf-continuous,hf-sequential ") == ("hf-sequential", "hf-continuous")
    assert parse_baselines(["hf-static"]) == ("hf-static",)


@pytest.mark.parametrize("value, named", [("hf-static,hf-fast", "unknown baseline 'hf-fast'"),
                                          (",", "no baseline named")])
def test_bad_baselines_are_one_line_on_stderr(value, named):
    result = runner.invoke(app, ["bench", "--model", "random:tiny-qwen3", "--baselines", value])
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: {named}; use a comma-separated subset of "
                                     "hf-sequential, hf-static, hf-continuous")
    assert "Traceback" not in result.output


def test_warm_up_runs_every_prompt_and_leaves_nothing_cached_for_the_timed_run():
    from core import LLM

    workload = make_workload(workload_spec("cpu"), 320, seed=0, num_requests=4, max_seq_len=512)
    llm = LLM("random:tiny-qwen3", device="cpu")
    warm_up(llm, workload)
    warmed = llm.stats()
    assert warmed["prompt_tokens"] == workload.prompt_tokens and warmed["cached_pages"] == 0
    result, _ = run_engine(llm, workload, lambda *args: None)
    timed = llm.stats()
    assert result.output_tokens == workload.output_tokens
    assert timed["prompt_tokens"] - warmed["prompt_tokens"] == workload.prompt_tokens
    assert timed["cached_prompt_tokens"] == warmed["cached_prompt_tokens"] == 0  # the same prompts, none reused


def test_batch1_request_takes_128_workload_ids_and_fits_the_context():
    workload = make_workload(workload_spec("cpu"), 320, seed=0, num_requests=4)
    ids = [t for r in workload.requests for t in r.prompt_ids]
    request = batch1_request(workload, max_seq_len=2048)
    assert request.prompt_ids == ids[:128] and request.max_tokens == 32  # the cpu workload's cheap decode
    assert workload_spec("nanovllm").batch1_tokens == 128
    short = batch1_request(workload, max_seq_len=100)
    assert len(short.prompt_ids) == 50 and short.max_tokens == 32


def test_batch1_latency_is_the_median_gap_of_one_request():
    from core import LLM

    llm = LLM("random:tiny-qwen3", device="cpu")
    assert run_batch1(llm, BenchRequest(list(range(1, 20)), 6)) > 0
    assert run_batch1(llm, BenchRequest([1, 2, 3], 1)) is None  # one token: no gap between tokens


def test_bench_view_shows_the_batch1_line():
    from rich.console import Console

    from render.bench import bench_view

    report = BenchReport(workload="nanovllm", model="m", device="d", requests=1, prompt_tokens=2,
                         results=[RunResult("minisgl", 1.0, 10, 1)],
                         latency=Latency(Percentiles.of([0.1]), Percentiles.of([0.002])),
                         matmul_gflops=0.0, model_gflop=1.0, batch1_ms_per_token=1.875)
    console = Console(width=120, record=True)
    console.print(bench_view(report))
    assert "batch-1 decode: 1.88 ms per token" in console.export_text()
    assert report.to_dict()["batch1_ms_per_token"] == 1.875


def test_bench_marks_the_runs_the_machine_was_busy_during():
    from rich.console import Console

    from core.cpu_share import OtherLoad
    from render.bench import bench_view

    busy, quiet = RunResult("hf-static", 2.0, 10, 1, OtherLoad(1.5, 2)), RunResult("minisgl", 1.0, 10, 1, OtherLoad(0.1, 2))
    report = BenchReport(workload="cpu", model="m", device="d", requests=1, prompt_tokens=2, results=[quiet, busy],
                         latency=None, matmul_gflops=0.0, model_gflop=1.0)
    console = Console(width=120, record=True)
    console.print(bench_view(report))
    text = console.export_text()
    assert "5.0 *" in text and "10.0 *" not in text  # hf-static's tokens/s is marked, the engine's not
    assert "* hf-static: the machine was busy (other processes used 1.5 of 2 CPUs" in text
    assert "minisgl: the machine was busy" not in text
    assert [r["busy"] for r in report.to_dict()["results"]] == [False, True]
    from core.bench.serve_report import ServeReport
    from render.bench_serve import serve_view

    console = Console(width=120, record=True)
    console.print(serve_view(ServeReport("cpu", "m", "u", 1, 2, 10, offline=replace(busy, name="offline"))))
    assert "* offline: the machine was busy" in console.export_text()  # the offline pass of --serve too


@pytest.mark.parametrize("value", ["0", "-3"])
def test_hf_requests_below_one_is_one_line_on_stderr(value):
    result = runner.invoke(app, ["bench", "--model", "random:tiny-qwen3", "--hf-requests", value])
    assert result.exit_code == 2
    # named by the option typed, not by the engine's field
    assert result.stderr.strip() == ("error: invalid value for '--hf-requests': Input should be greater than or "
                                     "equal to 1. See 'minisgl bench --help'.")
    assert "Traceback" not in result.output


def test_unknown_workload_is_one_line_on_stderr():
    result = runner.invoke(app, ["bench", "--workload", "huge", "--model", "random:tiny-qwen3"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: unknown workload 'huge'; use one of cpu, nanovllm"
    assert "Traceback" not in result.output


def test_workload_is_reproducible_and_within_its_ranges():
    spec = workload_spec("cpu")
    a = make_workload(spec, vocab_size=49152, seed=3)
    assert a == make_workload(spec, vocab_size=49152, seed=3)
    assert a != make_workload(spec, vocab_size=49152, seed=4)
    assert len(a.requests) == 32
    for req in a.requests:
        assert 16 <= len(req.prompt_ids) <= 128 and 16 <= req.max_tokens <= 64
        assert all(0 <= t <= 10000 for t in req.prompt_ids)  # nano-vllm's randint(0, 10000): both ends
    small = make_workload(spec, vocab_size=320, seed=3, num_requests=5)
    assert len(small.requests) == 5 and all(t < 320 for r in small.requests for t in r.prompt_ids)
    with pytest.raises(InvalidParamsError, match="requests must be an integer >= 1"):
        make_workload(spec, vocab_size=320, num_requests=0)


def test_model_flops_count_body_attention_and_lm_head(model_dirs):
    cfg = read_model_config(Path(model_dirs["llama"]))  # hidden 64, intermediate 128, 2 layers, 4 heads, 2 kv heads
    assert body_params(cfg) == 2 * (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 128)
    one = Workload(workload_spec("cpu"), [BenchRequest([1, 2], 2)], seed=0)
    tokens, pairs = 3, 1 + 2 + 3  # two prompt tokens and one fed back; each attends to itself and earlier ones
    expected = tokens * 2 * body_params(cfg) + pairs * 4 * 2 * 4 * 16 + 2 * 2 * 320 * 64
    assert workload_flops(cfg, one) == expected


def test_percentiles_use_nearest_rank():
    p = Percentiles.of([float(i) for i in range(1, 101)])
    assert (p.mean, p.p50, p.p99) == (50.5, 50.0, 99.0)
    assert Percentiles.of([]) == Percentiles(0.0, 0.0, 0.0)


def test_continuous_batching_config_takes_the_page_size_under_either_name():
    """transformers 5.x called it block_size before page_size; options it does not know are left out."""
    from dataclasses import dataclass

    from core.bench.hf import _continuous_config

    @dataclass
    class Older:
        block_size: int = 256
        num_blocks: int | None = None

    @dataclass
    class Newer:
        page_size: int = 256
        num_blocks: int | None = None
        auto_switch_to_flash: bool = True

    assert _continuous_config(Older, 64, num_blocks=9, auto_switch_to_flash=False) == Older(64, 9)
    assert _continuous_config(Newer, 64, num_blocks=9, auto_switch_to_flash=False) == Newer(64, 9, False)


def _costs():
    from core.bench.floor import ModelCosts
    return ModelCosts(weight_bytes=1000.0, kv_bytes_per_token=10.0, flops_per_token=100.0, attn_flops_per_pair=1.0)


def test_floor_reads_the_weights_each_step_and_each_running_requests_context():
    from core.bench.floor import Ceilings, workload_floor

    requests = [BenchRequest([1] * 4, 3), BenchRequest([1] * 2, 2)]  # decode steps: 2 and 1
    floor = workload_floor(_costs(), requests, Ceilings(copy_gbps=1e-9 * 1e3, matmul_gflops=1e-9 * 1e9))
    # step 1: contexts 4+1 and 2+1; step 2: 4+2 (the second request is done)
    assert floor.decode_steps == 2 and floor.kv_read_bytes == (5 + 3 + 6) * 10.0
    assert floor.weight_read_bytes == 2 * 1000.0
    # bytes at 1000 B/s: (1000 + 80) / 1000 + (1000 + 60) / 1000; FLOPs at 1e9 are negligible
    assert floor.decode_s == pytest.approx(1.08 + 1.06)
    prefill_flops = 6 * 100.0 + (4 * 5 / 2 + 2 * 3 / 2) * 1.0
    assert floor.prefill_flops == prefill_flops and floor.prefill_s == pytest.approx(1.0)  # the weights once
    assert floor.seconds == pytest.approx(floor.prefill_s + floor.decode_s)


def test_prefill_floor_takes_the_lm_head_once_a_prompt():
    """Only a prompt's last position needs logits: its other tokens cost the decoder's FLOPs alone."""
    from core.bench.floor import Ceilings, ModelCosts, workload_floor

    costs = ModelCosts(weight_bytes=1000.0, kv_bytes_per_token=10.0, flops_per_token=100.0, attn_flops_per_pair=1.0,
                       head_flops=40.0)
    requests = [BenchRequest([1] * 4, 3), BenchRequest([1] * 2, 2)]
    floor = workload_floor(costs, requests, Ceilings(copy_gbps=1e9, matmul_gflops=1e-9))  # 1 FLOP/s
    assert floor.prefill_flops == 6 * 60.0 + 2 * 40.0 + (4 * 5 / 2 + 2 * 3 / 2) * 1.0
    assert floor.prefill_s == pytest.approx(floor.prefill_flops)
    assert floor.decode_flops == 3 * 100.0 + (5 + 3 + 6) * 1.0  # every decode token samples: the head each time


def test_model_costs_name_the_lm_heads_share(model_dirs):
    from core.bench.floor import ModelCosts

    cfg = read_model_config(Path(model_dirs["llama"]))
    costs = ModelCosts.of(cfg, 4.0, 0.0, tp=2)
    assert costs.head_flops == 2 * cfg.vocab_size * cfg.hidden_size / 2
    assert costs.flops_per_token - costs.head_flops == 2 * body_params(cfg) / 2


def test_floor_takes_the_flops_when_they_are_the_longer_term():
    from core.bench.floor import Ceilings, batch1_floor_ms, workload_floor

    requests = [BenchRequest([1] * 4, 2)]
    floor = workload_floor(_costs(), requests, Ceilings(copy_gbps=1e9, matmul_gflops=1e-9))  # 1 FLOP/s
    assert floor.decode_s == pytest.approx(100.0 + 5 * 1.0)
    assert batch1_floor_ms(_costs(), BenchRequest([1] * 4, 2), Ceilings(copy_gbps=1e-6, matmul_gflops=1.0)) \
        == pytest.approx((1000.0 + 5 * 10.0) / 1e3 * 1e3)


def test_the_floors_read_at_the_better_of_the_copy_and_the_read_only_pass():
    from core.bench.floor import Ceilings, batch1_floor_ms

    request = BenchRequest([1] * 4, 2)
    copy_only = batch1_floor_ms(_costs(), request, Ceilings(copy_gbps=1e-6, matmul_gflops=1.0))
    assert batch1_floor_ms(_costs(), request, Ceilings(copy_gbps=1e-6, matmul_gflops=1.0, read_gbps=2e-6)) \
        == pytest.approx(copy_only / 2)
    assert batch1_floor_ms(_costs(), request, Ceilings(copy_gbps=1e-6, matmul_gflops=1.0, read_gbps=5e-7)) \
        == pytest.approx(copy_only)  # a slower read-only pass leaves the copy's figure


def test_bench_view_shows_the_floor_and_the_fraction():
    from rich.console import Console

    from core.bench.floor import Ceilings, workload_floor
    from render.bench import bench_view

    floor = workload_floor(_costs(), [BenchRequest([1] * 4, 3)], Ceilings(copy_gbps=1e-6, matmul_gflops=1.0))
    report = BenchReport(workload="nanovllm", model="m", device="d", requests=1, prompt_tokens=4,
                         results=[RunResult("minisgl", floor.seconds * 4, 3, 1)], latency=None,
                         matmul_gflops=1.0, model_gflop=1.0, copy_gbps=1e-6, floor=floor,
                         batch1_ms_per_token=2.0, batch1_floor_ms=0.5)
    console = Console(width=200, record=True)
    console.print(bench_view(report))
    text = console.export_text()
    assert "25% of the floor" in text
    # beside each figure: the run's tokens/s and the floor's with the share reached, batch-1's ms and its floor
    row = next(line for line in text.splitlines() if line.strip("│ ").startswith("minisgl"))
    assert f"{3 / (floor.seconds * 4):.1f}" in row and f"{3 / floor.seconds:.1f} (25%)" in row
    assert "batch-1 decode: 2.00 ms per token (median, one request alone; floor 0.500 ms" in text
    assert "25% of its speed" in text
    assert report.to_dict()["floor_fraction"] == 0.25 and report.to_dict()["floor"]["decode_steps"] == 2


def test_a_baseline_time_limit_measures_the_tokens_made_so_far():
    from core.bench.hf import hf_static
    from core.bench.random_hf import random_hf_model
    from core.models.random_spec import parse_random_spec
    import torch

    model = random_hf_model(parse_random_spec("random:tiny-qwen3"), torch.device("cpu"), torch.float32)
    workload = Workload(workload_spec("cpu"), [BenchRequest([1, 2, 3], 400), BenchRequest([4, 5], 300)], 0)
    result = hf_static(model, workload, lambda *args: None, seconds=0.2)
    assert 0 < result.output_tokens < workload.output_tokens and result.wall_s < 5
    steps = result.output_tokens // 2  # both rows still running: two useful tokens per step
    assert result.output_tokens == 2 * steps


def test_continuous_baseline_stops_at_its_time_limit_instead_of_finishing_the_requests():
    """Cut off by its time limit, transformers' continuous batching cancels what still runs: leaving its manager
    otherwise waits for every request (or a minute) first."""
    import time

    from core.bench.hf import hf_continuous
    from core.bench.random_hf import random_hf_model
    from core.models.random_spec import parse_random_spec
    import torch

    model = random_hf_model(parse_random_spec("random:tiny-qwen3"), torch.device("cpu"), torch.float32)
    workload = Workload(workload_spec("cpu"), [BenchRequest([1, 2, 3 + i], 3000) for i in range(6)], 0)
    start = time.perf_counter()
    result = hf_continuous(model, workload, lambda *args: None, seconds=0.5)
    assert 0 < result.output_tokens < workload.output_tokens
    assert time.perf_counter() - start < 10  # finishing 18,000 tokens here takes far longer


def test_kv_dtype_fp8_runs_the_bench_and_halves_the_kv_bytes(given_ceilings):
    result = runner.invoke(app, ["bench", "--model", "random:tiny-qwen3", "--requests", "2", "--json",
                                 "--threads", "1", "--skip-baselines", "--kv-dtype", "fp8"])
    assert result.exit_code == 0, result.output
    fp8 = json.loads(result.stdout)
    result = runner.invoke(app, ["bench", "--model", "random:tiny-qwen3", "--requests", "2", "--json",
                                 "--threads", "1", "--skip-baselines"])
    auto = json.loads(result.stdout)
    assert fp8["results"][0]["output_tokens"] == auto["results"][0]["output_tokens"]
    ratio = fp8["floor"]["kv_read_gb"] / auto["floor"]["kv_read_gb"]
    assert 0.25 < ratio < 0.5  # float32 on a CPU: 4 bytes a value against 1 plus a scale per head


def test_page_size_reaches_the_engine_and_the_report(given_ceilings):
    result = runner.invoke(app, ["bench", "--model", "random:tiny-qwen3", "--requests", "2", "--json",
                                 "--threads", "1", "--skip-baselines", "--page-size", "4"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["page_size"] == 4
    result = runner.invoke(app, ["bench", "--model", "random:tiny-qwen3", "--requests", "2", "--threads", "1",
                                 "--skip-baselines", "--page-size", "0"])
    assert result.exit_code != 0 and "--page-size" in result.output


def test_page_size_defaults_to_large_pages_on_cuda_only(monkeypatch):
    """CUDA: pages of 128, where flashinfer's decode reads a head-major pool fastest; a CPU: the engine's own."""
    import torch

    from core.bench.runner import CUDA_PAGE_SIZE, BenchOptions
    from core.config import EngineConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the engine's device rule, as on a GPU machine
    assert BenchOptions().engine_page_size() == CUDA_PAGE_SIZE
    assert BenchOptions(device="cuda").engine_page_size() == CUDA_PAGE_SIZE == 128
    assert BenchOptions(device="cuda:1").engine_page_size() == 128
    assert BenchOptions(device="cpu").engine_page_size() == EngineConfig.page_size == 1
    assert BenchOptions(device="cuda", page_size=16).engine_page_size() == 16


def test_the_nanovllm_workload_is_the_one_nano_vllm_publishes():
    """Seed 0 gives exactly nano-vllm's bench.py draw, which the peer harness and published figures use."""
    import random

    rng = random.Random(0)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(100, 1024))] for _ in range(256)]
    budgets = [rng.randint(100, 1024) for _ in range(256)]
    workload = make_workload(workload_spec("nanovllm"), vocab_size=151936)
    assert [r.prompt_ids for r in workload.requests] == prompts
    assert [r.max_tokens for r in workload.requests] == budgets
    assert workload.output_tokens == 133_966


def test_batch1_floor_counts_the_int8_bytes_the_decode_step_reads():
    """Under int8 one request's decode step reads int8 weights (the C step's copies, its LM head too; torch's
    int8 layers keep a float32 head), even where prefill and batches keep float32 ones."""
    from types import SimpleNamespace

    import torch

    from core.bench.floor import ModelCosts
    from core.bench.flops import body_params
    from core.bench.runner import _batch1_costs
    from core.engine.plan import PrecisionChoice
    from core.models.loader import read_model_config
    from core.models.weights import resolve_model_dir

    cfg = read_model_config(resolve_model_dir("random:small-qwen3"))
    head = cfg.vocab_size * cfg.hidden_size
    float32 = ModelCosts.of(cfg, 4, 10.0)
    assert float32.weight_bytes == 4 * (body_params(cfg) + head)

    def llm(**precision):
        engine = SimpleNamespace(plan=SimpleNamespace(precision=PrecisionChoice(torch.float32, **precision)),
                                 kv_bytes_per_token=10.0, dtype=torch.float32)
        return SimpleNamespace(engine=engine)

    assert _batch1_costs(llm(), cfg, float32, 1) is float32
    assert _batch1_costs(llm(c_decode=True, c_int8=True), cfg, float32, 1).weight_bytes == body_params(cfg) + head
    assert _batch1_costs(llm(int8_weights=True), cfg, float32, 1).weight_bytes == body_params(cfg) + 4 * head
