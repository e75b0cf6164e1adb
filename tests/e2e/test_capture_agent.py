"""`aiter-tuner capture` end to end: a real service over HTTP, the agent as a process with the service's
dependencies blocked, AITER's own log lines, a vLLM metrics page on loopback, rotation, outages, restarts."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from tests.conftest import DIGEST, ROOT, free_port, wait_for
from tests.unit.test_capture_parsing import aiter_lines

pytestmark = pytest.mark.e2e
AGENT = ROOT / "tests" / "fixtures" / "light_capture.py"
F = "/opt/aiter/aiter/configs/bf16_tuned_gemm.csv"


def bf16_miss(M, N, K):
    """tuned_gemm.py:232 (ROCm/aiter e4048607a5), rendered as a server logs it."""
    dtype = otype = "torch.bfloat16"
    bias = scaleAB = bpreshuffle = False
    return (f"[aiter] shape is M:{M}, N:{N}, K:{K} {dtype=} {otype=} {bias=}, {scaleAB=}, {bpreshuffle=}, not "
            f"found tuned config in {F}, will use default config! using torch solution:0\n")


def vllm_lengths(name: str, counts: dict[str, int]) -> list[str]:
    """A request length histogram as vLLM renders it (its 1-2-5 buckets, cumulative, one engine)."""
    out, total = [f"# TYPE {name} histogram"], 0
    for b in ("1", "2", "5", "10", "20", "50", "100", "200", "500", "1000", "2000", "+Inf"):
        total += counts.get(b, 0)
        le = b if b == "+Inf" else f"{float(b)}"
        out.append(f'{name}_bucket{{engine="0",le="{le}",model_name="meta-llama/Llama-3.1-70B"}} {float(total)}')
    return out


def vllm_metrics(steps: dict[str, int], prompt: dict[str, int] | None = None,
                 generation: dict[str, int] | None = None) -> str:
    """vLLM's /metrics as it renders the tokens-per-step histogram: cumulative buckets per engine and model (and
    the request length histograms, where given)."""
    out = ["# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.",
           "# TYPE vllm:iteration_tokens_total histogram"]
    if prompt is not None:
        out += vllm_lengths("vllm:request_prompt_tokens", prompt)
    if generation is not None:
        out += vllm_lengths("vllm:request_generation_tokens", generation)
    bounds = ["1", "8", "16", "32", "64", "128", "256", "512", "1024", "2048", "4096", "8192", "+Inf"]
    for engine in ("0", "1"):
        total = 0
        for b in bounds:
            total += steps.get(b, 0) // 2 + (steps.get(b, 0) % 2 if engine == "0" else 0)
            le = b if b == "+Inf" else f"{float(b)}"
            out.append(f'vllm:iteration_tokens_total_bucket{{engine="{engine}",le="{le}",'
                       f'model_name="meta-llama/Llama-3.1-70B"}} {float(total)}')
        out.append(f'vllm:iteration_tokens_total_count{{engine="{engine}",model_name="meta-llama/Llama-3.1-70B"}} '
                   f"{float(total)}")
    out.append("# TYPE vllm:num_requests_running gauge")
    out.append('vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-70B"} 3.0')
    return "\n".join(out) + "\n"


class MetricsPage:
    def __init__(self):
        self.text = vllm_metrics({})
        page = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                body = page.text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def metrics_page():
    page = MetricsPage()
    yield page
    page.server.shutdown()


@pytest.fixture
def agent_env(live_server):
    return dict(os.environ, TUNER_TOKEN=live_server.token("capture", "agent", DIGEST), PYTHONPATH=str(ROOT))


def agent(env, service, log, spool, *extra, stdin=None, check=None):
    args = [sys.executable, str(AGENT), "capture", "--service", service, "--image-digest", DIGEST, "--gfx", "gfx942",
            "--cu-num", "304", "--log", str(log), "--spool", str(spool), *extra]
    r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, input=stdin)
    if check is not None:
        assert r.returncode == check, r.stdout + r.stderr
    assert "imported on the light capture path" not in r.stderr, r.stderr
    return r


def calls(srv, family="bf16_gemm"):
    with srv.client() as c:
        camp = next((x for x in c.get("/v1/campaigns").json() if x["family"] == family), None)
        if camp is None:
            return {}
        shapes = c.get(f"/v1/campaigns/{camp['campaign_id']}").json()["shape_list"]
    return {s["shape"].get("M", s["shape"].get("token")): s["calls"] for s in shapes}


def test_once_posts_every_family_and_a_restart_counts_nothing_twice(live_server, agent_env, tmp_path):
    log = tmp_path / "server.log"
    bad = bf16_miss(3, 64, 64).replace("torch.bfloat16", "torch.float64")  # not a dtype AITER's tables hold
    log.write_text("INFO vLLM starting\n" + aiter_lines() + "\n" + bad)
    r = agent(agent_env, live_server.url, log, tmp_path / "spool", "--once", check=0)
    assert "line skipped: log.dtype: unknown dtype" in r.stderr
    assert calls(live_server) == {"20": 2, "100": 1}
    with live_server.client() as c:
        fams = {x["family"]: x["shapes"] for x in c.get("/v1/campaigns").json()}
    assert fams == {"bf16_gemm": 2, "a8w8_gemm": 1, "a8w8_blockscale_gemm": 1, "bf16_batched_gemm": 1, "fmoe": 1}
    assert calls(live_server, "fmoe") == {"32": 2} and calls(live_server, "a8w8_blockscale_gemm") == {"100": 2}
    agent(agent_env, live_server.url, log, tmp_path / "spool", "--once", check=0)  # a restart: nothing new
    assert calls(live_server) == {"20": 2, "100": 1}
    with open(log, "a") as f:
        f.write(bf16_miss(20, 4096, 4096) + bf16_miss(7, 4096, 4096) + "a line with no newline yet")
    agent(agent_env, live_server.url, log, tmp_path / "spool", "--once", check=0)
    assert calls(live_server) == {"20": 3, "100": 1, "7": 1}


def test_once_on_a_log_without_aiter_lines_says_so_and_what_it_looked_for(tmp_path):
    """Issue 33: it printed nothing, which reads as "posted". Nothing is posted (the service need not be up)."""
    log = tmp_path / "server.log"
    log.write_text("INFO vLLM starting\nINFO Uvicorn running on http://0.0.0.0:8000\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = agent(env, f"http://127.0.0.1:{free_port()}", log, tmp_path / "spool", "--once", check=0)
    assert f"nothing to post: no AITER lookup line in {log} (2 new line(s) read" in r.stderr, r.stderr
    assert "'shape is M:'" in r.stderr and "not found tuned config" in r.stderr
    assert "AITER_LOG_TUNED_CONFIG=1" in r.stderr


def test_service_down_then_back_drains_the_spool_and_a_lost_ack_is_not_counted_twice(live_server, agent_env,
                                                                                      tmp_path):
    log, spool = tmp_path / "server.log", tmp_path / "spool"
    log.write_text(bf16_miss(1, 1280, 8192) * 3 + bf16_miss(64, 1280, 8192))
    dead = f"http://127.0.0.1:{free_port()}"
    r = agent(agent_env, dead, log, spool, "--once", "--retry-s", "1", check=1)
    assert "kept in the spool" in r.stderr
    state = json.loads((spool / "state.json").read_text())
    assert len(state["pending"]) == 1 and state["log"]["offset"] == log.stat().st_size
    saved = (spool / "state.json").read_text()
    with open(log, "a") as f:  # the server keeps logging while the service is down
        f.write(bf16_miss(1, 1280, 8192))
    agent(agent_env, live_server.url, log, spool, "--once", check=0)
    assert calls(live_server) == {"1": 4, "64": 1}
    assert json.loads((spool / "state.json").read_text())["pending"] == []
    # the agent died after the service counted the capture but before it saved the ack: same capture_uid again
    (spool / "state.json").write_text(saved)
    r = agent(agent_env, live_server.url, log, spool, "--once", check=0)
    assert "already counted" in r.stderr
    assert calls(live_server) == {"1": 4, "64": 1}


def test_rotation_while_down_and_while_following(live_server, agent_env, tmp_path):
    log, spool = tmp_path / "server.log", tmp_path / "spool"
    log.write_text(bf16_miss(1, 64, 64))
    agent(agent_env, live_server.url, log, spool, "--once", check=0)
    with open(log, "a") as f:
        f.write(bf16_miss(2, 64, 64))  # written before the rotation, not yet read
    log.rename(tmp_path / "server.log.1")
    log.write_text(bf16_miss(3, 64, 64))
    r = agent(agent_env, live_server.url, log, spool, "--once", check=0)
    assert "resumed in rotated server.log.1" in r.stderr
    assert calls(live_server) == {"1": 1, "2": 1, "3": 1}
    # following: a rename under a running agent, then a copytruncate
    args = [sys.executable, str(AGENT), "capture", "--service", live_server.url, "--image-digest", DIGEST,
            "--gfx", "gfx942", "--cu-num", "304", "--log", str(log), "--spool", str(spool), "--follow",
            "--interval-s", "0.2"]
    proc = subprocess.Popen(args, cwd=ROOT, env=agent_env, stderr=subprocess.PIPE, text=True)
    try:
        with open(log, "a") as f:
            f.write(bf16_miss(4, 64, 64))
        wait_for(lambda: calls(live_server).get("4") == 1)
        with open(log, "a") as f:
            f.write(bf16_miss(5, 64, 64))
        log.rename(tmp_path / "server.log.2")
        log.write_text(bf16_miss(6, 64, 64))
        wait_for(lambda: calls(live_server).get("6") == 1)
        log.write_text("")  # copytruncate
        with open(log, "a") as f:
            f.write(bf16_miss(7, 64, 64))
        wait_for(lambda: calls(live_server).get("7") == 1)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    assert calls(live_server) == {str(m): 1 for m in range(1, 8)}


def test_metrics_weight_the_queue_by_served_steps(live_server, agent_env, tmp_path, metrics_page):
    log, spool = tmp_path / "server.log", tmp_path / "spool"
    log.write_text(bf16_miss(1, 1280, 8192) + bf16_miss(4096, 8192, 8192))
    agent(agent_env, live_server.url, log, tmp_path / "nometrics", "--once", check=0)
    with live_server.client() as c:
        (camp,) = c.get("/v1/campaigns").json()
        before = [s["shape"]["M"] for s in c.get(f"/v1/campaigns/{camp['campaign_id']}").json()["shape_list"]]
    assert before == ["4096", "1"] and camp["priority_rule"] == "calls x default time"
    hist = {"1": 9000, "8": 400, "16": 200, "32": 100, "64": 80, "128": 60, "256": 50, "512": 40, "1024": 30,
            "2048": 20, "4096": 10, "8192": 10}
    metrics_page.text = vllm_metrics(hist)
    log.write_text("")  # same shapes already captured; this agent sends the steps
    agent(agent_env, live_server.url, tmp_path / "other.log", spool, "--metrics-url", metrics_page.url, "--once",
          check=0)  # no family seen yet: the steps wait for one, nothing sent
    assert json.loads((spool / "state.json").read_text())["metrics"] is None
    (tmp_path / "other.log").write_text(bf16_miss(1, 1280, 8192))
    agent(agent_env, live_server.url, tmp_path / "other.log", spool, "--metrics-url", metrics_page.url, "--once",
          check=0)
    with live_server.client() as c:
        summary = c.get(f"/v1/campaigns/{camp['campaign_id']}").json()
    assert summary["priority_rule"] == "served steps x default time" and summary["steps_seen"] == sum(hist.values())
    assert [s["shape"]["M"] for s in summary["shape_list"]] == ["1", "4096"]
    # later steps, no new log lines: a metrics-only update to the families this agent has seen
    metrics_page.text = vllm_metrics({b: 2 * n for b, n in hist.items()})
    agent(agent_env, live_server.url, tmp_path / "other.log", spool, "--metrics-url", metrics_page.url, "--once",
          check=0)
    agent(agent_env, live_server.url, tmp_path / "other.log", spool, "--metrics-url", metrics_page.url, "--once",
          check=0)  # nothing changed since: nothing sent
    with live_server.client() as c:
        summary = c.get(f"/v1/campaigns/{camp['campaign_id']}").json()
    assert summary["steps_seen"] == 2 * sum(hist.values())
    assert {s["shape"]["M"]: s["calls"] for s in summary["shape_list"]} == {"1": 2, "4096": 1}


def test_served_request_lengths_reach_the_campaign_once(live_server, agent_env, tmp_path, metrics_page):
    """vLLM's prompt and generation length histograms ride with the step counts: their medians become the
    campaign's served lengths (the serving A/B's default input/output lengths), each request counted once."""
    log, spool = tmp_path / "server.log", tmp_path / "spool"
    log.write_text(bf16_miss(1, 1280, 8192))
    prompt, gen = {"100": 10, "200": 30, "500": 10}, {"50": 20, "100": 30}
    metrics_page.text = vllm_metrics({"1": 90, "8": 10}, prompt, gen)
    for _ in range(2):  # the second reading has nothing new: nothing counted twice
        agent(agent_env, live_server.url, log, spool, "--metrics-url", metrics_page.url, "--once", check=0)
    with live_server.client() as c:
        (camp,) = c.get("/v1/campaigns").json()
    # medians, linear inside the bucket as Prometheus's histogram_quantile: prompt, the 25th of 50 is the 15th of
    # 30 in (100, 200] -> 150; generation, the 5th of 30 in (50, 100] -> 58
    assert camp["served_lengths"] == {"prompt_median": 150, "generation_median": 58} and camp["requests_seen"] == 50
    metrics_page.text = vllm_metrics({"1": 180, "8": 20}, {k: 2 * v for k, v in prompt.items()},
                                     {k: 2 * v for k, v in gen.items()})
    agent(agent_env, live_server.url, log, spool, "--metrics-url", metrics_page.url, "--once", check=0)
    with live_server.client() as c:
        (camp,) = c.get("/v1/campaigns").json()
    assert camp["requests_seen"] == 100 and camp["steps_seen"] == 200


def test_stdin(live_server, agent_env, tmp_path):
    agent(agent_env, live_server.url, "-", tmp_path / "spool", "--once", stdin=bf16_miss(9, 64, 64) * 2, check=0)
    assert calls(live_server) == {"9": 2}


def test_the_gpu_is_the_campaign_and_gpu_archs_cu_num_reach_the_prediction(live_server, agent_env, tmp_path):
    """A gfx942/304 GPU (rocminfo) served with GPU_ARCHS="gfx942;gfx950" and CU_NUM=80: the campaign is the GPU,
    and the service predicts with what AITER's lookups make of the environment: bf16's get_gfx() takes gfx950
    (chip_info.py get_gfx_custom_op_core), get_cu_num() 80; the hit line AITER prints with cu_num=80 is counted."""
    from tests.unit.test_capture_parts import ROCMINFO
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "rocminfo").write_text(f"#!/bin/sh\ncat <<'EOF'\n{ROCMINFO}EOF\n")
    (bin_dir / "rocminfo").chmod(0o755)
    dtype = otype = "torch.bfloat16"
    bias = scaleAB = bpreshuffle = False
    hit = (f"[aiter] shape is M:100, N:64, K:64 {dtype=} {otype=} {bias=}, {scaleAB=}, {bpreshuffle=} found padded_M: "
           f"112, N:64, K:64 is tuned on cu_num = 80 in {F}, libtype is asm, kernel name is k\n")  # tuned_gemm.py:183
    log = tmp_path / "s.log"
    log.write_text(bf16_miss(9, 64, 64) + hit)
    env = dict(agent_env, PATH=f"{bin_dir}:{agent_env['PATH']}", GPU_ARCHS="gfx942;gfx950", CU_NUM="80")
    args = [sys.executable, str(AGENT), "capture", "--service", live_server.url, "--image-digest", DIGEST, "--log",
            str(log), "--spool", str(tmp_path / "spool"), "--once"]
    r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    with live_server.client() as c:
        (camp,) = [x for x in c.get("/v1/campaigns").json() if x["family"] == "bf16_gemm"]
        assert (camp["gfx"], camp["cu_num"]) == ("gfx942", 304)
        ident = c.get(f"/v1/campaigns/{camp['campaign_id']}/engagement").json()["identity"]
    assert ident["env"] == {"GPU_ARCHS": "gfx942;gfx950", "CU_NUM": "80"}
    assert (ident["lookup_gfx"], ident["lookup_cu_num"]) == ("gfx950", 80)
    assert calls(live_server) == {"9": 1, "100": 1}
