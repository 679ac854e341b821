"""``minisgl bench``: the command completes on a tiny model and reports every figure; no timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from core.bench.flops import body_params, workload_flops
from core.bench.report import Percentiles
from core.bench.workload import BenchRequest, Workload, make_workload, workload_spec
from core.errors import InvalidParamsError
from core.models.loader import read_model_config
from minisgl_cli.app import app

runner = CliRunner()


def test_bench_json_reports_engine_and_every_baseline(model_dirs):
    result = runner.invoke(app, ["bench", "--model", model_dirs["llama"], "--requests", "4", "--json",
                                 "--threads", "1"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
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
        assert set(r) == {"name", "wall_s", "output_tokens", "output_tokens_per_s"}
        assert r["output_tokens"] == expected  # EOS ignored: each request makes exactly max_tokens
        assert r["wall_s"] > 0 and r["output_tokens_per_s"] > 0
    assert report["matmul_gflops"] > 0 and report["model_flops_fraction"] > 0
    assert report["latency"]["ttft_s"]["p50"] > 0 and report["latency"]["tpot_s"]["p99"] > 0


def test_random_spec_runs_the_engine_and_says_why_baselines_are_left_out():
    result = runner.invoke(app, ["bench", "--model", "random:tiny-qwen3", "--requests", "2", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [r["name"] for r in report["results"]] == ["minisgl"]
    assert set(report["skipped"]) == {"hf-sequential", "hf-static", "hf-continuous"}
    assert "hf-static left out: transformers needs a checkpoint directory" in result.stderr


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
        assert all(0 <= t < 10000 for t in req.prompt_ids)
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
