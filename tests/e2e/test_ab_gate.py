"""The serving A/B gate end to end: a real service process, the driver (`aiter-tuner ab drive`) starting real
planted-effect stand-in servers (tests/fixtures/ab_standin_server.py: +8% output tok/s at concurrency >= 16 and
-3% at <= 2 when its AITER_CONFIG_* files hold rows serving those batch sizes, none between), and each fault:
an unreachable endpoint, a server that dies mid-run, an arm whose files did not take, a band with too few
requests. Each ends in a void verdict naming why, nothing half-booked, and the run resumable."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from app.ab_wire import ARMS
from tests.conftest import ADMIN, DIGEST, ROOT, free_port
from tests.integration.test_ab_api import seed_overlay

pytestmark = pytest.mark.e2e

STANDIN = ROOT / "tests" / "fixtures" / "ab_standin_server.py"
MODEL = "standin"
RANKS = 2
# each pass ~1 s at 40 ms a token: c2 3 waves of 8 tokens (6 requests), c8 and c16 one wave of 24
POINTS = [{"concurrency": 2, "input_len": 16, "output_len": 8}, {"concurrency": 8, "input_len": 16, "output_len": 24},
          {"concurrency": 16, "input_len": 16, "output_len": 24}]
# The overlay: bf16 GEMM rows at M = 1, 2, 16, 64 (N = K = 4096). AITER tries raw M, then 16-multiples, then the next
# power of two (tuned_gemm.py), so batch sizes 1 and 2 take the M=1 and M=2 rows (the stand-in: -3%), 3..15 the M=16
# row by padding (no effect between), 16 the M=16 row (+8%). A rollback of c2 (batch sizes 1..2) withdraws every row
# AITER would pick for 1 or 2 once the others are gone: M=1, M=2 and M=16 (its padded bucket serves them).
ROWS_M = (1, 2, 16, 64)
WITHDRAWN_M = ["1", "2", "16"]
# The measured gate (benchmarks/ab_gate.py measures how often it is right): 6 rounds at confidence 0.99 over
# the 3 bands, the verdict on the decode rate (ab_stats.PRIMARY). A decode step takes 12 ms + 3 ms per running
# sequence (c2 18 ms, c8 36 ms, c16 60 ms), so 16 streams ask this shared 2-core VM for 270 tokens/s, not 800:
# at 20 ms flat, c16's passes were CPU-bound (pass-to-pass sd 10-14%, benchmarks/RESULTS.md). c2 decodes 2 streams
# and this VM's ~10 ms stalls land on a request's first and last token, so its passes hold 12 requests of 32
# tokens (a 0.56 s decode span); c8 16 requests and c16 16 of 24 tokens (c16: one wave, all decoding together,
# as the +8% plant needs 16 running).
POINTS_NAME = [f"c{p['concurrency']}-i{p['input_len']}-o{p['output_len']}" for p in POINTS]
GATE_POINTS = [{"concurrency": 2, "input_len": 16, "output_len": 32, "requests": 12},
               {"concurrency": 8, "input_len": 16, "output_len": 24, "requests": 16},
               {"concurrency": 16, "input_len": 16, "output_len": 24, "requests": 16}]
BANDS = dict(zip((f"c{p['concurrency']}-i{p['input_len']}-o{p['output_len']}" for p in GATE_POINTS),
                 ("regression", "neutral", "gain")))
# Sequential rounds: a band still undecided after 6 rounds (its interval holds 0 and its MDE is above 2.5%, or it
# cannot rule out a 5% loss) is measured 6 rounds more at a time, up to 18 (3 looks; every interval at 0.99 split
# over 3 bands and 3 looks). Whole cycles of the round orders at every look: every arm in every place equally often.
GATE = {"token_ms": "--token-ms 12 --batch-ms 3", "repeats": 6, "requests_per_pass": 8, "confidence": 0.99,
        "points": GATE_POINTS, "max_repeats": 18, "target_mde": 0.025}


def launch(extra: str = "", b_extra: str | None = None, b_prefix: str = "") -> str:
    """The launch command the driver fills ({port}, {log}, {arm}); b_extra / b_prefix: only for arm B."""
    base = f"{shlex.quote(sys.executable)} {shlex.quote(str(STANDIN))} --port {{port}} --log-file {{log}} " \
           f"--ranks {RANKS} --model {MODEL}"
    if b_extra is None and not b_prefix:
        return f"{base} {extra}".strip()
    b = f"{b_prefix}{base} {extra} {b_extra or ''}".strip()
    return f"sh -c {shlex.quote(f'if [ {{arm}} = B ]; then exec {b}; else exec {base} {extra}; fi')}"


def ab(srv, *args: str, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", "ab", "--service", srv.url, "--token", ADMIN, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=env or dict(os.environ, PYTHONPATH=str(ROOT)))


PER_RANK = "{log}.rank{rank}"  # launch()'s stand-in writes a file per rank (--log-file without --one-log)


def drive(srv, run_id: int, workdir: Path, launch_cmd: str | None = None, *extra: str,
          rank_log: str | None = PER_RANK) -> subprocess.CompletedProcess:
    args = ["drive", str(run_id), "--model", MODEL, "--ranks", str(RANKS), "--workdir", str(workdir),
            "--health-timeout", "60", *(["--rank-log", rank_log] if rank_log else []), *extra]
    if launch_cmd:
        args += ["--launch", launch_cmd]
    return ab(srv, *args)


def new_run(c, version_id: int, **over) -> dict:
    body = {"image_digest": DIGEST, "version_id": version_id, "baseline": "shipped", "points": POINTS,
            "repeats": 4, "requests_per_pass": 12, **over}
    r = c.post("/v1/ab/runs", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def bands(run: dict) -> dict[str, str]:
    return {b["band"]: b["verdict"] for b in run["result"]["bands"]}


@pytest.fixture
def gate(live_server):
    c = live_server.client()
    seed_overlay(c, ROWS_M)
    v = c.post("/v1/ab/versions", json={"image_digest": DIGEST}).json()
    return live_server, c, v


@pytest.mark.skipif(not os.environ.get("TUNER_AB_GATE_E2E"), reason="statistical, opt-in (TUNER_AB_GATE_E2E=1): on a "
                    "loaded 2-core VM the bands' MDE exceeds the planted 3-8% (benchmarks/RESULTS.md, issue 32)")
def test_the_gate_finds_the_planted_bands_rolls_back_and_promotes(gate, tmp_path):
    """Statistical: right at the rate benchmarks/ab_gate.py reports; run it on a quiet machine."""
    srv, c, v = gate
    gate_run = {k: GATE[k] for k in ("repeats", "requests_per_pass", "confidence", "points", "max_repeats",
                                     "target_mde")}
    run = new_run(c, v["id"], **gate_run)
    out = drive(srv, run["id"], tmp_path / "d1", launch(GATE["token_ms"]))
    assert out.returncode == 0, out.stderr[-3000:]
    got = c.get(f"/v1/ab/runs/{run['id']}").json()
    assert got["state"] == "booked" and bands(got) == BANDS, json.dumps(got["result"], indent=1)[:4000]
    assert got["result"]["control_flagged"] == [] and got["result"]["engagement"]["ok"]
    assert [r["rank"] for r in got["result"]["engagement"]["ranks"]] == [str(r) for r in range(RANKS)]
    rb = c.get(f"/v1/ab/versions/{got['rollback_version_id']}").json()
    assert [w["row"]["M"] for w in rb["withdrawn"]] == WITHDRAWN_M  # exactly the rows serving batch sizes 1..2
    run2 = new_run(c, rb["id"], **gate_run)
    out = drive(srv, run2["id"], tmp_path / "d2", launch(GATE["token_ms"]))
    assert out.returncode == 0, out.stderr[-3000:]
    got2 = c.get(f"/v1/ab/runs/{run2['id']}").json()
    # the M=16 row went with the rollback (it serves batch sizes 1..2 by padding): every band neutral, promotable
    assert set(bands(got2).values()) == {"neutral"} and got2["result"]["promotable"] is None
    assert ab(srv, "promote", str(run2["id"])).returncode == 0
    assert c.get(f"/v1/overlays/{DIGEST}/bf16_gemm.csv").headers["x-aiter-version"] == str(rb["id"])


def test_the_driver_measures_the_rounds_an_undecided_band_is_extended_by(gate, tmp_path):
    """No effect at c8 and a target MDE no run reaches: the band is undecided at every look, so the service
    extends it 2 -> 8 rounds (6 more, cut at the cap) and the driver measures the extension before the run books.
    Confidence 0.9999: at the default 0.95 the identical-arm control alone voids the run (booked at once, no
    extension) with ~2.5% chance at each of the 2 looks (alpha split over them), ~5% a run: CI failed on it once."""
    srv, c, v = gate
    run = new_run(c, v["id"], points=POINTS[1:2], repeats=2, max_repeats=8, target_mde=1e-6, confidence=0.9999)
    # each launch notes its arm and how many arms the service had then (each posts once healthy, warm and asked
    # the accuracy prompts): the servers start together, so none had, and none is older by another's warm-up
    started = tmp_path / "started"  # (no braces in the note: the driver formats the launch)
    ask = (f"import httpx, sys; r = httpx.get('{srv.url}/v1/ab/runs/{run['id']}', headers=dict(Authorization="
           f"'Bearer {ADMIN}')).json(); print(sys.argv[1], len(r['arms_posted']))")
    note = f"{shlex.quote(sys.executable)} -c {shlex.quote(ask)} {{arm}} >> {shlex.quote(str(started))}"
    out = drive(srv, run["id"], tmp_path / "d", f"{note}; {launch()}")
    assert out.returncode == 0, out.stderr[-3000:]
    got = c.get(f"/v1/ab/runs/{run['id']}").json()
    assert sorted(started.read_text().split()) == sorted([*ARMS, "0", "0", "0"]) and got["start_order"][1] == "A"
    assert got["state"] == "booked" and got["passes_done"] == 8 * 3 and got["rounds"] == {POINTS_NAME[1]: 8}, \
        (got["passes_done"], got.get("reason"), got.get("result", {}) and got["result"].get("control_flagged"))
    assert [b["rounds"] for b in got["result"]["bands"]] == [8]


def test_an_unreachable_endpoint_interrupts_the_run_which_resumes(gate, tmp_path):
    srv, c, v = gate
    run = new_run(c, v["id"], points=POINTS[2:])
    dead = f"http://127.0.0.1:{free_port()}"
    out = drive(srv, run["id"], tmp_path / "d", None, "--endpoint", f"A={dead}", "--endpoint", f"B={dead}",
                "--health-timeout", "2")
    assert out.returncode == 3 and "unreachable" in out.stderr
    got = c.get(f"/v1/ab/runs/{run['id']}").json()
    assert got["state"] == "interrupted" and got["verdict"] == "void" and "unreachable" in got["reason"]
    assert got["passes_done"] == 0 and got["result"] is None  # nothing booked
    out = drive(srv, run["id"], tmp_path / "d2", launch())  # re-driven: continues and books
    assert out.returncode == 0, out.stderr[-3000:]
    assert c.get(f"/v1/ab/runs/{run['id']}").json()["state"] == "booked"


def test_a_server_that_dies_mid_run_interrupts_it_without_half_a_pass(gate, tmp_path):
    srv, c, v = gate
    run = new_run(c, v["id"], points=POINTS[2:])
    # arm B's server exits at request 91: warm-up 16, 32 accuracy prompts, rounds 0 and 1 (16 a pass), then mid-pass
    # in round 2
    out = drive(srv, run["id"], tmp_path / "d", launch(b_extra="--die-after-requests 90"))
    assert out.returncode == 3 and "server exited" in out.stderr, out.stderr[-3000:]
    got = c.get(f"/v1/ab/runs/{run['id']}").json()
    assert got["state"] == "interrupted" and "arm B" in got["reason"] and got["result"] is None
    stored = got["passes_done"]
    assert 0 < stored < got["passes_total"]
    passes = [p for p in c.get(f"/v1/ab/runs/{run['id']}").json()["todo"]]
    assert len(passes) == got["passes_total"] - stored  # the pass in flight was not stored
    out = drive(srv, run["id"], tmp_path / "d2", launch())
    assert out.returncode == 0, out.stderr[-3000:]
    done = c.get(f"/v1/ab/runs/{run['id']}").json()
    assert done["state"] == "booked" and done["passes_done"] == done["passes_total"]
    # the cut pass was not stored: a stored pass with its failed requests would void the band ("requests failed")
    (b,) = done["result"]["bands"]
    assert b["verdict"] != "void", b["reason"]


def test_an_arm_whose_files_did_not_take_is_void_not_neutral(gate, tmp_path):
    srv, c, v = gate
    run = new_run(c, v["id"], points=POINTS[1:2])
    # arm B starts without its AITER_CONFIG_GEMM_BF16: it serves the shipped tables, logs no hit of our rows
    out = drive(srv, run["id"], tmp_path / "d", launch(b_prefix="env -u AITER_CONFIG_GEMM_BF16 "))
    assert out.returncode == 0, out.stderr[-3000:]
    got = c.get(f"/v1/ab/runs/{run['id']}").json()
    assert got["verdict"] == "void" and "B did not engage" in got["reason"]
    assert "rank 0 logged no hit line" in got["reason"] and "rank 1 logged no hit line" in got["reason"]
    assert c.post(f"/v1/ab/runs/{run['id']}/promote").status_code == 409


@pytest.mark.parametrize("plant, why", [
    ("--flip-ties 0.03", None),  # a few near-tie flips (A's top two within 0.03 nats): within tolerance
    ("--logprob-shift -0.3", "whose tokens' logprobs moved more than 0.1 nats"),
    ("--token-salt other", "answered otherwise than A (first: prompt 0 at token 0")])
def test_the_accuracy_check_tells_a_kernel_that_changes_answers_from_near_tie_flips(gate, tmp_path, plant, why):
    """B's server answers the 32 accuracy prompts as planted; the check reads them against A's with its stated
    tolerance (ab_gate.accuracy)."""
    srv, c, v = gate
    run = new_run(c, v["id"], points=POINTS[1:2], repeats=2)
    out = drive(srv, run["id"], tmp_path / "d", launch(b_extra=plant))
    assert out.returncode == 0, out.stderr[-3000:]
    got = c.get(f"/v1/ab/runs/{run['id']}").json()
    acc = got["result"]["accuracy"]
    assert acc["prompts"] == 32 and acc["ok"] == (why is None), acc
    if why:
        assert got["verdict"] == "void" and "accuracy: arm B: " in got["reason"] and why in got["reason"], got["reason"]
    else:  # B's answers flipped (not A's) and the accuracy check voids nothing (the identical-arm control may still
        # void the run on a loaded 2-core machine: "a noisy node", a timing verdict that is not this test's)
        assert acc["arms"]["B"]["flips"] > 0 and acc["arms"]["A_prime"]["flips"] == 0, acc
        assert "accuracy" not in (got["reason"] or ""), got["reason"]


def test_a_band_with_too_few_requests_is_void_naming_why(gate, tmp_path):
    srv, c, v = gate
    run = new_run(c, v["id"], points=POINTS[1:2], requests_per_pass=2, min_requests=12)  # 8 a pass (c8)
    out = drive(srv, run["id"], tmp_path / "d", launch())
    assert out.returncode == 0, out.stderr[-3000:]
    got = c.get(f"/v1/ab/runs/{run['id']}").json()
    (b,) = got["result"]["bands"]
    assert b["verdict"] == "void" and "too few requests" in b["reason"] and "completed 8 of 8 (at least 12 needed)" in b["reason"]
    assert got["verdict"] == "void" and c.post(f"/v1/ab/runs/{run['id']}/promote").status_code == 409


def _alive(pid: int) -> bool:
    """Running, or a process not reaped yet that has not exited (a zombie has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")
@pytest.mark.parametrize("sig,forks", [("SIGKILL", False), ("SIGTERM", True)])
def test_a_killed_driver_leaves_no_server_running(gate, tmp_path, sig, forks):
    """SIGKILL: no handler of the driver's runs; the kernel's PR_SET_PDEATHSIG ends each server it launched.
    SIGTERM, through a launch command that forks the server (sh waits on it, no exec): the driver ends each server's
    process group, so the grandchild goes too."""
    import signal
    import time

    srv, c, v = gate
    run = new_run(c, v["id"], points=POINTS[2:], repeats=8)
    cmd = launch()
    if forks:
        cmd = f"sh -c {shlex.quote(cmd + '; echo server ended')}"
    args = [sys.executable, "-m", "app.cli", "ab", "--service", srv.url, "--token", ADMIN, "drive", str(run["id"]),
            "--model", MODEL, "--ranks", str(RANKS), "--workdir", str(tmp_path / "d"), "--health-timeout", "60",
            "--rank-log", PER_RANK, "--launch", cmd]
    drv = subprocess.Popen(args, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
    try:
        # every arm's server is up once the first pass is stored (the driver starts all three first)
        while c.get(f"/v1/ab/runs/{run['id']}").json()["passes_done"] < 1:
            assert drv.poll() is None, drv.stderr.read().decode()[-3000:]
            time.sleep(0.2)
        logs = [tmp_path / "d" / arm / "server.log" for arm in ("A", "A_prime", "B")]
        pids = [int(line.split("pid=")[1].split()[0]) for f in logs for line in f.read_text().splitlines()
                if line.startswith("standin pid=")]
        assert len(pids) == 3 and all(map(_alive, pids))
        drv.send_signal(getattr(signal, sig))
        drv.wait(timeout=60)
        end = time.monotonic() + 60  # a bound for a loaded machine, not a wait: the loop ends when they are gone
        while any(map(_alive, pids)) and time.monotonic() < end:
            time.sleep(0.2)
        assert not [p for p in pids if _alive(p)], f"stand-ins left running after the driver's {sig}"
    finally:
        if drv.poll() is None:
            drv.kill()
            drv.wait()


def test_the_cli_takes_a_bands_requests_with_its_point(gate):
    """`ab create --point C:IN:OUT:REQUESTS`: the band's own requests per pass (a low-concurrency band needs more
    for the same interval); without it the run's; anything else is refused naming the form, nothing created."""
    srv, c, v = gate
    out = ab(srv, "create", DIGEST, "--version", str(v["id"]), "--baseline", "shipped", "--point", "2:16:32:24",
             "--point", "8:16:24", "--requests", "12")
    assert out.returncode == 0, out.stderr
    run = json.loads(out.stdout)
    assert [(p["concurrency"], p.get("requests")) for p in run["points"]] == [(2, 24), (8, None)]
    assert [t["n_requests"] for t in run["todo"] if t["repeat"] == 0 and t["arm"] == "A"] == [24, 12]
    n = len(c.get("/v1/ab/runs").json())
    for bad in ("2:16", "2:16:32:24:1", "2:x:32"):
        out = ab(srv, "create", DIGEST, "--version", str(v["id"]), "--point", bad)
        assert out.returncode == 2 and "CONCURRENCY:INPUT_LEN:OUTPUT_LEN[:REQUESTS]" in out.stderr, out.stderr
    assert len(c.get("/v1/ab/runs").json()) == n


def test_a_launch_as_the_readme_writes_it_books_an_engaged_run(gate, tmp_path):
    """The README's launch: a shell command whose redirect writes the server's one log; the ranks' lines in it
    carry vLLM's worker prefixes, and every hit is logged at start-up, before /health answers (--log-at-start, as
    vLLM's CUDA graph capture does). The driver's default reads that one file from the server's start, split by
    rank: the run books engaged on both ranks."""
    srv, c, v = gate
    run = new_run(c, v["id"], points=POINTS[1:2])
    cmd = (f"{shlex.quote(sys.executable)} {shlex.quote(str(STANDIN))} --port {{port}} --ranks {RANKS} "
           f"--model {MODEL} --log-at-start > {{log}} 2>&1")
    out = drive(srv, run["id"], tmp_path / "d", cmd, rank_log=None)
    assert out.returncode == 0, out.stderr[-3000:]
    got = c.get(f"/v1/ab/runs/{run['id']}").json()
    eng = got["result"]["engagement"]
    assert got["state"] == "booked" and eng["ok"], json.dumps(got["result"], indent=1)[:3000]
    assert [r["rank"] for r in eng["ranks"]] == ["0", "1"] and all(r["hits"] > 0 for r in eng["ranks"])
    log = (tmp_path / "d" / "B" / "server.log").read_text()
    assert "(Worker_TP1 pid=" in log and "is tuned on cu_num" in log  # the one file, as the redirect wrote it


def test_a_version_naming_an_unresolvable_path_is_refused_before_any_server_starts(gate, tmp_path):
    """A version frozen before the service refused them, whose layer value names the unknown configs folder's
    placeholder: AITER would skip that path and serve the overlay without the shipped rows, so the drive stops
    before it starts a server."""
    from app.db.models import OverlayVersion
    from app.db.session import Database
    srv, c, v = gate
    with Database(srv.db_url).session() as s:
        ov = s.get(OverlayVersion, v["id"])
        ov.files = [dict(f, paths=["<aiter package>/aiter/configs/bf16_tuned_gemm.csv", "@overlay"])
                    for f in ov.files]
    run = new_run(c, v["id"], points=POINTS[1:2])
    out = drive(srv, run["id"], tmp_path / "d", launch())
    assert out.returncode == 3 and "a path no server can open" in out.stderr, out.stderr[-3000:]
    assert not any((tmp_path / "d" / arm / "stdout.log").exists() for arm in ("A", "A_prime", "B"))
    got = c.get(f"/v1/ab/runs/{run['id']}").json()
    assert got["state"] == "interrupted" and "<aiter package>" in got["reason"]


def test_a_launch_through_the_shell_ends_on_sigterm_not_at_the_kill_timeout(tmp_path):
    """The keeper a launch runs under passes SIGTERM to its group and exits when the shell does (143), rather than
    waiting out _kill_group's timeout to be SIGKILLed (-9): 10 s per arm per drive, seen as a slower CI run."""
    import os
    import time

    from app.ab_driver import _SHELL_KEEPER, _child_setup, _kill_group
    pidfile = tmp_path / "pid"
    cmd = f"sh -c 'echo $$ > {pidfile}; exec sleep 300' > {tmp_path / 'log'} 2>&1"
    p = subprocess.Popen([sys.executable, "-c", _SHELL_KEEPER, cmd], preexec_fn=_child_setup(os.getpid()))
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert p.poll() is None
        time.sleep(0.05)
    server = int(pidfile.read_text())
    _kill_group(p)
    assert p.returncode == 128 + 15, p.returncode
    end = time.monotonic() + 30  # a bound for a loaded machine: the loop ends when the server is gone
    while _alive(server) and time.monotonic() < end:
        time.sleep(0.1)
    assert not _alive(server)
