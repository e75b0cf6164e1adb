"""Reading the field's load generators back into the gate's records (app/ab_bench.py): vLLM's `vllm bench serve`
result (--save-detailed) and SGLang's bench_serving line (--output-details, flat or under "details"), in the
layouts their sources write (vllm/benchmarks/serve.py, python/sglang/bench_serving.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from app import ab_bench
from app.ab_bench import PRESETS, BenchFailed, BenchLoad, check_template, read_result, records
from app.ab_wire import OperatingPoint

POINT = OperatingPoint(concurrency=2, input_len=16, output_len=4)
VLLM = {"duration": 1.0, "completed": 2, "failed": 2, "input_lens": [16, 16, 16, 16], "output_lens": [4, 2, 0, 0],
        "ttfts": [0.05, 0.06, 0.0, 0.0], "itls": [[0.01, 0.02, 0.01], [0.01], [], []],
        "latencies": [0.095, 0.07, 0.0, 0.0], "start_times": [100.5, 100.6, 100.7, 100.8],
        "errors": ["", "", "Traceback ...\nClientConnectorError: refused\n", ""],
        "generated_texts": ["a b c d", "a b", "", ""]}


def test_a_vllm_result_reads_into_one_record_per_request_like_the_own_loop():
    recs = records(VLLM, POINT, arm="B", repeat=3, started_at=100.0, window=(100.4, 101.5))
    assert [(r.arm, r.band, r.repeat) for r in recs] == [("B", POINT.name, 3)] * 4
    ok, short, failed, silent = recs
    assert (ok.ttft_s, ok.itl_s, ok.latency_s, ok.output_tokens, ok.error) == (0.05, [0.01, 0.02, 0.01], 0.095, 4,
                                                                               None)
    assert ok.started_s == pytest.approx(0.5)  # the bench's own perf_counter, on the driver's clock
    assert short.error == "stream ended after 2 of 4 tokens"  # as the own loop books a short stream
    assert failed.ttft_s is None and failed.itl_s == [] and failed.output_tokens == 0
    assert failed.error.endswith("ClientConnectorError: refused")
    assert silent.error == "no token came" and silent.ttft_s is None  # no error text, but no token either


def test_start_times_off_the_passes_window_are_shifted_to_its_start():
    """A bench on another clock (or another host): its start times keep their spacing from the pass's start."""
    recs = records(VLLM, POINT, arm="A", repeat=0, started_at=90.0, window=(500.0, 501.0))
    assert [r.started_s for r in recs] == pytest.approx([410.0, 410.1, 410.2, 410.3])


def test_a_result_without_start_times_replays_its_closed_loop():
    """SGLang records none: at concurrency 2 the first two start with the pass, the third when the first of them
    ends (its TTFT and gaps), the fourth when the next slot frees, so the gate's tokens per second are the loop's."""
    res = {"input_lens": [16] * 4, "output_lens": [4] * 4, "ttfts": [0.1, 0.2, 0.1, 0.1],
           "itls": [[0.1] * 3, [0.1] * 3, [0.5] * 3, [0.1] * 3], "errors": [""] * 4}
    recs = records(res, POINT, arm="A", repeat=0, started_at=0.0, window=(10.0, 20.0))
    assert [r.started_s for r in recs] == pytest.approx([10.0, 10.0, 10.4, 10.5])


@pytest.mark.parametrize("nested", [False, True])
def test_an_sglang_line_reads_alike_its_latency_from_ttft_and_gaps(tmp_path, nested):
    details = {"input_lens": [16, 16], "output_lens": [4, 4], "ttfts": [0.05, 0.0], "itls": [[0.01] * 3, []],
               "generated_texts": ["a b c d", ""], "errors": ["", "Not Found: model"]}
    line = {"backend": "vllm", "completed": 1, **({"details": details} if nested else details)}
    f = tmp_path / "out.jsonl"
    f.write_text(json.dumps({"backend": "old run"}) + "\n" + json.dumps(line) + "\n")  # appended: the last line
    ok, failed = records(read_result(f), POINT, arm="A_prime", repeat=1, started_at=0.0, window=(5.0, 6.0))
    assert ok.latency_s == pytest.approx(0.08) and ok.output_tokens == 4 and ok.started_s == 5.0 and ok.error is None
    assert failed.error == "Not Found: model" and failed.ttft_s is None


def test_a_result_without_per_request_details_or_json_is_a_failed_bench(tmp_path):
    summary = {k: v for k, v in VLLM.items() if k not in ("ttfts", "itls")}  # run without --save-detailed
    with pytest.raises(BenchFailed, match="--save-detailed"):
        records(summary, POINT, arm="A", repeat=0, started_at=0.0, window=(0.0, 1.0))
    with pytest.raises(BenchFailed, match="differ in length"):
        records(dict(VLLM, errors=[""]), POINT, arm="A", repeat=0, started_at=0.0, window=(0.0, 1.0))
    with pytest.raises(BenchFailed, match="no result file"):
        read_result(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("Traceback (most recent call last):\n")
    with pytest.raises(BenchFailed, match="not JSON"):
        read_result(tmp_path / "bad.json")


def test_a_load_command_must_name_known_fields_and_where_its_result_goes():
    assert all(check_template(t) is None for t in PRESETS.values())
    assert check_template("b --result-dir {result_dir} --result-filename {result_name}") is None
    for bad, why in (("vllm bench serve --port {port} --result {result}", "it names {port}"),
                     ("b --base-url {base_url}", "names no {result}"),
                     ("b --result-filename {result_name}", "names no {result}"),  # lands in the driver's folder
                     ("b --out {{result}}", "names no {result}"),
                     ("b --out {result.x}", "it names {result.x}"),
                     ("b --out {result!r}", "no conversion or format spec"),
                     ("b --out {result", "not a template")):
        assert why in (check_template(bad) or ""), bad


def test_a_bench_past_its_limit_is_ended_with_what_it_started(tmp_path, monkeypatch):
    """The bench's whole process group goes (the shell and its children), and the pass fails naming the limit."""
    monkeypatch.setattr(ab_bench, "START_S", 0.0)
    pid = tmp_path / "pid"
    load = BenchLoad(f"sleep 60 & echo $! > {pid}; wait; : {{result}}", tmp_path)
    with pytest.raises(BenchFailed, match="ran past 1 s"):
        asyncio.run(load.drive_band("http://127.0.0.1:9", "m", POINT, arm="A", repeat=0, n_requests=2, seed=1,
                                    started_at=0.0, timeout_s=1.0))
    child = int(pid.read_text())
    stat = Path(f"/proc/{child}/stat")
    assert not stat.exists() or stat.read_text().split(") ")[1].startswith("Z")  # killed (a zombie at most)
