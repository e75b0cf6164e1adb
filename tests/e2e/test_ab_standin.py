"""The serving A/B's planted-effect stand-in (tests/fixtures/ab_standin_server.py) as real processes, driven by the
load generator (app/ab_load.py): the plant is where issue 32 puts it, the logs parse as AITER's, the metrics as
vLLM's, and the faults (a dying server, an unreachable one, a rank that ignores its files) look like the real ones."""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.ab_load import drive_band, greedy_answers
from app.ab_wire import OperatingPoint
from app.capture.metrics import cumulative
from app.domain.log_lines import parse_log
from tests.conftest import ROOT, free_port, wait_for

pytestmark = pytest.mark.e2e
STANDIN = ROOT / "tests" / "fixtures" / "ab_standin_server.py"
HEADER = "gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,kernelName,err_ratio,tflops,bw"
MODEL = "ab-standin"


def overlay(path: Path, ms: tuple[int, ...], n: int = 4096, k: int = 4096, gfx: str = "gfx942") -> Path:
    path.write_text(HEADER + "\n" + "".join(
        f"{gfx},304,{m},{n},{k},False,torch.bfloat16,torch.bfloat16,False,False,torch,0,0,10.0,torch_k{m},0.0,1,1\n"
        for m in ms))
    return path


class Standin:
    def __init__(self, tmp: Path, name: str, overlay_csv: Path | None, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AITER_CONFIG_")}
        if overlay_csv is not None:
            env["AITER_CONFIG_GEMM_BF16"] = str(overlay_csv)
        self.proc = subprocess.Popen([sys.executable, str(STANDIN), "--port", str(self.port), "--log-file",
                                      str(self.log), *args], env=env, stdout=subprocess.DEVNULL,
                                     stderr=open(tmp / f"{name}.err", "w"))

    def wait_ready(self) -> Standin:
        wait_for(lambda: self.proc.poll() is not None or (self.log.exists() and
                                                          f"ready on port {self.port}" in self.log.read_text()),
                 timeout=60)
        assert self.proc.poll() is None, "stand-in exited at start"
        return self

    def rank_log(self, r: int) -> str:
        return Path(f"{self.log}.rank{r}").read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def standins(tmp_path):
    started: list[Standin] = []

    def start(name: str, overlay_csv: Path | None, *args: str) -> Standin:
        s = Standin(tmp_path, name, overlay_csv, *args)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def rate(recs) -> list[float]:
    """Each request's decode rate, tokens after the first over the time after the first: the plant is on decode
    (TTFT carries the connection set-up, 100-250 ms for 32 at once on this loaded VM, and dilutes a rate taken
    from the request's start)."""
    assert all(r.error is None for r in recs), [r.error for r in recs if r.error][:3]
    return [(r.output_tokens - 1) / (r.latency_s - r.ttft_s) for r in recs]


async def ab_ratio(a: Standin, b: Standin, point: OperatingPoint, passes: int, n: int) -> float:
    """B's mean request tok/s over A's, passes interleaved ABBA so drift cancels."""
    t0 = time.monotonic()
    got: dict[str, list[float]] = {"A": [], "B": []}
    for rep in range(passes):
        order = (("A", a), ("B", b)) if rep % 2 == 0 else (("B", b), ("A", a))
        for arm, srv in order:
            recs = await drive_band(srv.url, MODEL, point, arm=arm, repeat=rep, n_requests=n, seed=rep,
                                    started_at=t0)
            assert len(recs) == n and all(r.band == point.name and r.arm == arm for r in recs)
            got[arm] += rate(recs)
    return statistics.mean(got["B"]) / statistics.mean(got["A"])


# The default plant (+8% / -3%) is below what a 2-core machine shared by busy neighbours resolves in a few passes
# (measured here: per-request CV 5-9%, pass-to-pass load swings of a few %, c32 streams CPU-bound), so these
# tests plant +50% / -30% through the flags and check where the effect lands, band by band; the default's
# magnitude is the >= 20-run benchmark's to resolve. Slower tokens at high concurrency keep every chunk on time
# (this VM streamed ~1,250 chunks/s under load; c32 at 60 ms needs ~530).
PLANT = ("--gain-pct", "50", "--regression-pct", "30")


@pytest.mark.parametrize("conc,token_ms,n,lo,hi", [
    (2, 10.0, 32, 0.6, 0.85),    # planted -30%: rows M=1 and M=2 serve batch sizes 1 and 2
    (8, 20.0, 32, 0.9, 1.1),     # nothing planted: no row serves 8 (AITER tries 8, 16, 8)
    (32, 60.0, 64, 1.3, 1.6),    # planted +50%: the M=32 row serves 17..32 (gl0/gl1 padding)
])
def test_planted_effect_per_band(standins, tmp_path, conc, token_ms, n, lo, hi):
    ov = overlay(tmp_path / "ov.csv", (1, 2, 32, 64))
    a = standins("A", None, "--token-ms", str(token_ms), "--seed", "7", *PLANT)
    b = standins("B", ov, "--token-ms", str(token_ms), "--seed", "7", *PLANT)
    a.wait_ready(), b.wait_ready()
    point = OperatingPoint(concurrency=conc, input_len=32, output_len=16)
    ratio = asyncio.run(ab_ratio(a, b, point, passes=4, n=n))
    print(f"c{conc} ratio {ratio:.4f}")
    assert lo < ratio < hi, f"c{conc}: B/A {ratio:.4f} outside ({lo}, {hi})"


def test_no_rows_no_effect_and_rows_elsewhere_no_effect(standins, tmp_path):
    """An overlay whose rows serve no band (M=8 only: batch sizes 5-8 and, padded, none of 1, 2 or >= 16) and an
    empty one plant nothing at c2: the rows, not the env var being set, make the effect."""
    a = standins("A", None, "--token-ms", "10", *PLANT)
    b = standins("B", overlay(tmp_path / "mid.csv", (8,)), "--token-ms", "10", *PLANT)
    e = standins("E", overlay(tmp_path / "empty.csv", ()), "--token-ms", "10", *PLANT)
    for s in (a, b, e):
        s.wait_ready()
    point = OperatingPoint(concurrency=2, input_len=32, output_len=16)
    assert 0.9 < asyncio.run(ab_ratio(a, b, point, passes=2, n=32)) < 1.1
    assert 0.9 < asyncio.run(ab_ratio(a, e, point, passes=2, n=32)) < 1.1


def test_logs_metrics_greedy_and_a_rank_that_ignores_its_files(standins, tmp_path):
    ov = overlay(tmp_path / "ov.csv", (1, 2, 32, 64))
    b = standins("B", ov, "--ranks", "2", "--rank-ignores-configs", "1", "--jit-after-requests", "5",
                 "--token-ms", "2").wait_ready()
    a = standins("A", None, "--token-ms", "2").wait_ready()
    salted = standins("S", None, "--token-ms", "2", "--token-salt", "x").wait_ready()
    point = OperatingPoint(concurrency=2, input_len=20, output_len=8)
    recs = asyncio.run(drive_band(b.url, MODEL, point, arm="B", repeat=0, n_requests=8, seed=1, started_at=0.0))
    assert [r.error for r in recs] == [None] * 8
    assert all(r.output_tokens == 8 and len(r.itl_s) == 7 and r.input_tokens == 20 and r.ttft_s for r in recs)

    # rank 0 found the overlay's rows (AITER's hit line, parsed back by the capture's own parser), rank 1 did not
    ev0, ev1 = parse_log(b.rank_log(0)).events, parse_log(b.rank_log(1)).events
    hits0 = {(e.shape["M"], e.padded_m, e.file) for e in ev0 if e.hit}
    assert ("2", 2, str(ov)) in hits0 and all(e.family == "bf16_gemm" for e in ev0)
    assert not any(e.hit for e in ev1) and any(not e.hit and e.shape["N"] == "4096" for e in ev1)
    for r in (0, 1):  # the JIT line at request 5, on every rank
        assert "start build [module_late_jit] under" in b.rank_log(r)

    m = httpx.get(b.url + "/metrics").text
    assert sum(cumulative(m).values()) > 0  # vllm:iteration_tokens_total, as the capture agent reads it
    assert 'vllm:num_requests_running{model_name="ab-standin"}' in m
    assert 'vllm:generation_tokens_total{model_name="ab-standin"} 64.0' in m
    assert 'vllm:request_prompt_tokens_count{model_name="ab-standin"} 8.0' in m

    prompts = ["one two three", "four five six seven"]
    ga = asyncio.run(greedy_answers(a.url, MODEL, prompts, 5))
    assert ga == asyncio.run(greedy_answers(b.url, MODEL, prompts, 5))  # same prompt, same tokens and logprobs
    assert all(len(x.tokens) == len(x.logprobs) == len(x.runner_up) == 5 for x in ga)
    assert all(lp is not None and ru is not None and ru < lp for x in ga for lp, ru in zip(x.logprobs, x.runner_up))
    assert [x.tokens for x in ga] != [x.tokens for x in asyncio.run(greedy_answers(salted.url, MODEL, prompts, 5))]


def test_a_dying_server_gives_failed_records_then_connect_error(standins, tmp_path):
    s = standins("D", None, "--die-after-requests", "5", "--token-ms", "5").wait_ready()
    point = OperatingPoint(concurrency=2, input_len=8, output_len=40)
    recs = asyncio.run(drive_band(s.url, MODEL, point, arm="A", repeat=0, n_requests=10, seed=0, started_at=0.0))
    assert len(recs) == 10
    assert [r.error for r in recs[:4]] == [None] * 4  # requests 1-4 ended before request 6 (c2) arrived
    assert sum(r.error is not None for r in recs) == 6  # 5 cut mid-stream, 6 refused, 7-10 find no server
    assert all(r.error is None or "lost" in r.error or "Error" in r.error or "ended after" in r.error
               for r in recs)
    s.proc.wait(timeout=30)
    assert s.proc.returncode == 3
    with pytest.raises(httpx.ConnectError):
        asyncio.run(drive_band(s.url, MODEL, point, arm="A", repeat=1, n_requests=2, seed=0, started_at=0.0))
