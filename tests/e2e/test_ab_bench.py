"""The gate driven by the field's load generators (app/ab_bench.py): `aiter-tuner ab drive --load vllm` runs the
vllm preset's command unchanged (`vllm bench serve ...`), `--load sglang` SGLang's (`python3 -m
sglang.bench_serving ...`), each resolved on PATH to tests/fixtures/bench_standin.py, which speaks their flags and
writes their result layouts (neither tool is installed here: each pulls gigabytes, tests/e2e/test_ab_vllm.py).
Against the vLLM-API stand-in server they book an engaged run as the own loop does; a bench that writes nothing
interrupts the run, naming its log; and both loads give the same records for the same band."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import time
from pathlib import Path

import pytest

from app.ab_bench import PRESETS, BenchLoad
from app.ab_load import drive_band
from app.ab_wire import OperatingPoint
from tests.conftest import ROOT, max_in_flight
from tests.e2e.test_ab_gate import MODEL, POINTS, RANKS, ab, gate, launch, new_run  # noqa: F401 (gate: a fixture)
from tests.e2e.test_ab_standin import MODEL as STANDIN_MODEL, standins  # noqa: F401 (standins: a fixture)

pytestmark = pytest.mark.e2e
BENCH = ROOT / "tests" / "fixtures" / "bench_standin.py"


@pytest.fixture
def bench_path(tmp_path) -> dict[str, str]:
    """PATH with `vllm` and `python3` shims first: `vllm bench serve` and `python3 -m sglang.bench_serving` reach
    the bench stand-in; any other python3 call reaches the real one."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    py, stand = shlex.quote(sys.executable), shlex.quote(str(BENCH))
    (bin_ / "vllm").write_text(f'#!/bin/sh\nexec {py} {stand} "$@"\n')
    (bin_ / "python3").write_text('#!/bin/sh\nif [ "$1 $2" = "-m sglang.bench_serving" ]; then shift 2; '
                                  f'exec {py} {stand} sglang "$@"; fi\nexec {py} "$@"\n')
    for f in bin_.iterdir():
        f.chmod(0o755)
    return dict(os.environ, PYTHONPATH=str(ROOT), PATH=f"{bin_}:{os.environ['PATH']}")


def drive_with(srv, run_id: int, workdir: Path, env: dict[str, str], *load: str):
    return ab(srv, "drive", str(run_id), "--model", MODEL, "--ranks", str(RANKS), "--workdir", str(workdir),
              "--health-timeout", "60", "--rank-log", "{log}.rank{rank}", "--launch", launch(), *load, env=env)


@pytest.mark.parametrize("tool", ["vllm", "sglang"])
def test_the_gate_runs_end_to_end_with_a_field_load_generator(gate, tmp_path, bench_path, tool):
    srv, c, v = gate
    run = new_run(c, v["id"], points=POINTS[1:2], repeats=2, requests_per_pass=8)
    out = drive_with(srv, run["id"], tmp_path / "d", bench_path, "--load", tool)
    assert out.returncode == 0, out.stderr[-3000:]
    got = c.get(f"/v1/ab/runs/{run['id']}").json()
    assert got["state"] == "booked" and got["result"]["engagement"]["ok"], json.dumps(got, indent=1)[:3000]
    assert got["passes_done"] == 2 * 3
    band = got["result"]["bands"][0]
    assert band["verdict"] != "void" and band["requests"] == {"A": 16, "A_prime": 16, "B": 16}, band  # all read back
    log = (tmp_path / "d" / "B" / "bench.log").read_text()
    first = PRESETS[tool].split(" --")[0]  # the preset's own command ran, through the shim on PATH
    assert f"$ {first} " in log and "--max-concurrency 8" in log
    assert len(list((tmp_path / "d" / "B" / "bench").iterdir())) == 1 + 2  # the warm-up's result and 2 passes'


def test_a_load_command_that_writes_no_result_interrupts_the_run_naming_its_log(gate, tmp_path, bench_path):
    srv, c, v = gate
    run = new_run(c, v["id"], points=POINTS[1:2], repeats=2)
    bad = ab(srv, "drive", str(run["id"]), "--model", MODEL, "--load-cmd", "vllm bench serve --port {port}")
    assert bad.returncode == 2 and "--load-cmd: it names {port}" in bad.stderr
    out = drive_with(srv, run["id"], tmp_path / "d", bench_path, "--load-cmd", "echo no result for {result}")
    assert out.returncode == 3 and "no load while warming" in out.stderr and "bench.log" in out.stderr, out.stderr
    got = c.get(f"/v1/ab/runs/{run['id']}").json()
    assert got["state"] == "interrupted" and got["passes_done"] == 0 and "exited 0 with no result file" in \
        got["reason"]
    assert "$ echo no result for" in (tmp_path / "d" / got["start_order"][0] / "bench.log").read_text()
    out = drive_with(srv, run["id"], tmp_path / "d", bench_path, "--load", "vllm")  # resumes with a working load
    assert out.returncode == 0, out.stderr[-3000:]
    assert c.get(f"/v1/ab/runs/{run['id']}").json()["state"] == "booked"


def test_one_run_is_measured_by_one_load(gate, tmp_path, bench_path):
    """A run's passes all come from the load that measured its first: a re-drive with another is refused before any
    server starts, and a pass posted by another load is a 409 naming `load`, nothing stored."""
    srv, c, v = gate
    run = new_run(c, v["id"], points=POINTS[1:2], repeats=2, requests_per_pass=8)
    out = drive_with(srv, run["id"], tmp_path / "d", bench_path, "--load", "vllm", "--max-passes", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    got = c.get(f"/v1/ab/runs/{run['id']}").json()
    assert got["load"] == "vllm" and got["passes_done"] == 2
    out = drive_with(srv, run["id"], tmp_path / "own", bench_path)  # the own loop
    assert out.returncode == 3 and "measured by the 'vllm' load" in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "own").exists() or not any((tmp_path / "own").rglob("*.log"))  # no server started
    got = c.get(f"/v1/ab/runs/{run['id']}").json()
    assert got["state"] == "interrupted" and got["passes_done"] == 2 and "'own'" in got["fault"]
    c.post(f"/v1/ab/runs/{run['id']}/start")
    todo = got["todo"][0]
    r = c.post(f"/v1/ab/runs/{run['id']}/passes", json={k: todo[k] for k in ("band", "repeat", "arm")} | {
        "records": [], "load": "sglang"})
    assert r.status_code == 409 and r.json()["field"] == "load" and "'vllm'" in r.json()["detail"], r.text
    assert c.get(f"/v1/ab/runs/{run['id']}").json()["passes_done"] == 2
    out = drive_with(srv, run["id"], tmp_path / "d", bench_path, "--load", "vllm")  # the same load resumes
    assert out.returncode == 0, out.stderr[-3000:]
    got = c.get(f"/v1/ab/runs/{run['id']}").json()
    assert got["state"] == "booked" and got["passes_done"] == 2 * 3 and got["load"] == "vllm"
    assert 'id="ab-load">vllm<' in c.get(f"/ab/{run['id']}").text


def test_both_loads_give_the_same_records_for_a_band(standins, tmp_path, bench_path, monkeypatch):
    """The own loop and `vllm bench serve` (the preset, through the shim) at one band of one server: the same
    requests, tokens in and out, a first token and every gap, start times on the driver's clock."""
    monkeypatch.setenv("PATH", bench_path["PATH"])
    srv = standins("s", None, "--token-ms", "5").wait_ready()
    point = OperatingPoint(concurrency=4, input_len=8, output_len=6)

    async def both():
        t0 = time.monotonic()
        own = await drive_band(srv.url, STANDIN_MODEL, point, arm="A", repeat=1, n_requests=8, seed=5,
                               started_at=t0)
        t1 = time.monotonic()
        bench = await BenchLoad(PRESETS["vllm"], tmp_path).drive_band(
            srv.url, STANDIN_MODEL, point, arm="A", repeat=1, n_requests=8, seed=5, started_at=t0)
        return own, bench, t1 - t0, time.monotonic() - t0
    own, bench, t1, t2 = asyncio.run(both())
    for recs in (own, bench):
        assert len(recs) == 8 and all(r.error is None for r in recs), [r.error for r in recs]
        assert {(r.arm, r.band, r.repeat, r.input_tokens, r.output_tokens, len(r.itl_s)) for r in recs} == \
            {("A", point.name, 1, 8, 6, 5)}
        assert all(0 < r.ttft_s <= r.latency_s for r in recs)
    assert all(r.started_s <= t1 for r in own)
    assert all(t1 <= r.started_s <= t2 for r in bench)
    for recs in (own, bench):  # each request's own start: the band's concurrency in flight, never more
        assert max_in_flight(recs) == 4
