"""``minisgl bench --serve``: the real command as a subprocess on a tiny random model, starting its own server,
measuring every rate and leaving no server behind (also after Ctrl-C); and its parts on their own. No timing
is asserted."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from core.bench.serve_report import RateResult, RequestTiming, ServeReport
from core.bench.workload import make_workload, redraw_ids, workload_spec
from core.errors import InvalidParamsError
from minisgl_cli.bench_serve import check_combination, check_url
from minisgl_cli.serve_client import arrival_offsets, parse_rates
from tests.support.cli import interrupt_after

ROOT = Path(__file__).resolve().parents[2]
MODEL = "random:tiny-qwen3"
REQUESTS = 6


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "minisgl_cli", "bench", "--serve", "--model", MODEL, "--requests", str(REQUESTS),
            "--threads", "1", "--json", *args]


def servers_on(port: int) -> list[int]:
    """Pids of any process still running ``minisgl serve`` on ``port``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and b"--port" in argv and str(port).encode() in argv:
            found.append(int(entry.name))
    return found


def port_of(report: dict) -> int:
    return int(report["url"].rsplit(":", 1)[1])


def finished(process: subprocess.Popen, timeout_s: float) -> subprocess.CompletedProcess:
    try:
        out, err = process.communicate(timeout=timeout_s)
    finally:
        if process.poll() is None:
            process.kill()
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def interrupted(process: subprocess.Popen) -> subprocess.CompletedProcess:
    """Ctrl-C at the slow rate's first answer: the inf rate is done, 0.2 under way."""
    out, err = interrupt_after(process, "rate 0.2:", timeout_s=60)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.fixture(scope="module")
def runs() -> dict[str, subprocess.CompletedProcess]:
    """The command's two runs, side by side (each mostly waits: on its imports, its server's start, the slow
    rate's arrivals): one measured whole, and one interrupted."""
    whole, cut = (subprocess.Popen(command(*args), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True) for args in (("--rate", "inf,8"), ("--rate", "inf,0.2", "--skip-offline")))
    with ThreadPoolExecutor(2) as pool:
        whole_run, cut_run = pool.submit(finished, whole, 180), pool.submit(interrupted, cut)
        return {"whole": whole_run.result(), "interrupted": cut_run.result()}


def test_every_rate_is_measured_and_the_server_is_stopped(runs):
    done = runs["whole"]
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [r["rate"] for r in report["rates"]] == ["inf", "8"]
    assert report["requests"] == REQUESTS and report["interrupted"] is False
    assert report["offline"]["output_tokens"] == report["output_tokens"] > 0
    for rate in report["rates"]:
        assert rate["completed"] == REQUESTS and rate["failed"] == 0
        assert rate["output_tokens"] == report["output_tokens"]  # ignore_eos: exactly max_tokens each
        assert rate["output_tokens_per_s"] > 0 and rate["of_offline"] > 0
        assert 0 < rate["ttft_s"]["p50"] <= rate["e2e_s"]["p50"]
        assert rate["ttft_s"]["p99"] <= rate["e2e_s"]["p99"]
        assert rate["tpot_s"]["mean"] > 0 and rate["itl_s"]["p99"] > 0
    assert servers_on(port_of(report)) == []


def test_ctrl_c_prints_the_rates_measured_and_stops_the_server(runs):
    done = runs["interrupted"]
    assert done.returncode == 130, done.stderr
    report = json.loads(done.stdout)
    assert report["interrupted"] is True and report["offline"] is None
    assert [r["rate"] for r in report["rates"]] == ["inf"] and report["rates"][0]["completed"] == REQUESTS
    assert servers_on(port_of(report)) == []


@pytest.mark.parametrize("rate", ["fast", "-1", "0", "8,,inf", "nan"])
def test_a_bad_rate_is_one_line_and_exit_2_before_anything_loads(rate):
    probe = ("import atexit, sys\n"
             "atexit.register(lambda: print('torch loaded' if 'torch' in sys.modules else 'nothing loaded'))\n"
             "from minisgl_cli.app import main\n"
             f"sys.argv = ['minisgl', 'bench', '--serve', '--rate={rate}']\n"
             "main()\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and "--rate" in done.stderr and done.stderr.count("\n") == 1
    assert done.stdout.strip() == "nothing loaded"


def test_options_of_the_other_mode_are_refused():
    with pytest.raises(InvalidParamsError, match="--rate is an option of --serve"):
        check_combination(False, {"--rate": "8"}, {})
    with pytest.raises(InvalidParamsError, match="--baselines has no meaning with --serve"):
        check_combination(True, {}, {"--baselines": "hf-static"})
    check_combination(True, {"--rate": "8"}, {"--skip-baselines": False})


def test_url_is_the_server_root():
    assert check_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    assert check_url("http://host:1") == "http://host:1"
    with pytest.raises(InvalidParamsError, match="http://"):
        check_url("localhost:8000")
    assert check_url("http://host:1", api_key="k") == "http://host:1"
    with pytest.raises(InvalidParamsError, match="--api-key is the key of the server at --url"):
        check_url(None, api_key="k")  # a server started here wants no key


def test_rates_parse_in_order():
    assert parse_rates("16,32,inf") == (16.0, 32.0, math.inf)
    assert parse_rates(" 0.5 ") == (0.5,)


def test_arrivals_are_seeded_poisson_and_all_at_once_for_inf():
    offsets = arrival_offsets(200, 10.0, seed=3)
    assert offsets == arrival_offsets(200, 10.0, seed=3) and offsets[0] == 0.0
    assert offsets == sorted(offsets) and 10 < offsets[-1] < 30  # mean gap 1/10 s
    assert arrival_offsets(5, math.inf, seed=3) == [0.0] * 5


def test_redrawn_prompts_keep_every_shape():
    workload = make_workload(workload_spec("cpu"), 320, seed=0, num_requests=8)
    fresh = redraw_ids(workload, 320, salt=7)
    assert [len(r.prompt_ids) for r in fresh.requests] == [len(r.prompt_ids) for r in workload.requests]
    assert [r.max_tokens for r in fresh.requests] == [r.max_tokens for r in workload.requests]
    assert [r.prompt_ids for r in fresh.requests] != [r.prompt_ids for r in workload.requests]
    assert redraw_ids(workload, 320, salt=7) == fresh and max(max(r.prompt_ids) for r in fresh.requests) < 320


def test_rate_figures_follow_vllms_definitions():
    timings = [RequestTiming(True, 5, 0.1, 0.5, (0.1, 0.1, 0.2)), RequestTiming(True, 1, 0.2, 0.2, ()),
               RequestTiming(False, 0, 1.0, 1.0, (), "HTTP 400: too long")]
    result = RateResult(8.0, 2.0, timings)
    assert (result.completed, result.failed, result.output_tokens) == (2, 1, 6)
    assert result.output_tokens_per_s == 3.0
    assert result.tpot.mean == pytest.approx(0.1)  # (0.5 - 0.1) / 4; a one-token request has none
    assert result.itl.p99 == 0.2 and result.ttft.p50 == 0.1 and result.first_error == "HTTP 400: too long"
    report = ServeReport("cpu", "m", "http://x", 3, 10, 6, rates=[result])
    assert report.to_dict()["rates"][0]["rate"] == "8" and report.of_offline(result) is None
    assert RateResult(math.inf, 1.0, []).to_dict()["rate"] == "inf"
