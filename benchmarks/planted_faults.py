"""Planted faults against the torch race on a GPU (issue 34): each must be caught, none may win.

1. an off-stream launch: the candidate's GEMM goes to a side stream, so a CUDA graph captured on the capture
   stream records nothing (it replays in ~0 us); the capture guard (poisoned output, one replay, checked) must
   reject it. Also shown: with the guard's check forced to pass, it would have won.
2. a candidate wrong in one element (AITER's 5% error ratio alone passes it) and 3. one wrong past the
   tolerance: precomputed outputs (the fastest candidates there are), both must fail the check.
4. a busy neighbour: a second process looping GEMMs on the same GPU, started before capture window 3 of a
   race: the control kernel's drift must flag the window, which is timed again once the neighbour is gone
   (figures: the control's idle and busy times); a neighbour that stays hands the lease back (GpuBusy); and
   one already running before a race is named by the process check (nvidia-smi) where it can attribute PIDs.
Run: python benchmarks/planted_faults.py --device cuda:0 [--out f.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from app.domain.families import FAMILIES  # noqa: E402
from app.domain.shapes import make_shape  # noqa: E402
from workers import gpu_idle  # noqa: E402
from workers.backends import torch_checks, torch_race  # noqa: E402
from workers.backends.base import Batch, GpuBusy  # noqa: E402
from workers.backends.torch_race import DEFAULT, TorchBackend  # noqa: E402
from workers.identity import detect  # noqa: E402

NEIGHBOUR = ("import torch, sys\nx = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
             "y = x @ x\ntorch.cuda.synchronize()\nprint('go', flush=True)\nwhile True:\n    y = x @ x\n")


def lease(ident, m, n, k):
    fam = FAMILIES["bf16_gemm"]
    item = {"shape_id": 1, "shape": make_shape(fam, {"M": m, "N": n, "K": k}).as_dict()}
    return {"gfx": ident.gfx, "cu_num": ident.cu_num, "tuned_header": list(fam.tuned_header), "shapes": [item]}


def tune(backend, ls, extra=None):
    real = torch_race.candidates
    if extra:
        torch_race.candidates = lambda a, b, bias, d: real(a, b, bias, d) + extra(a, b, bias, d)  # type: ignore
    try:
        t = time.perf_counter()
        res = backend.tune(Batch(ls, time.monotonic() + 1e6, lambda: False), ls["shapes"][0])
        return res, time.perf_counter() - t
    finally:
        torch_race.candidates = real


def off_stream(a, b, bias, d):
    side = torch.cuda.Stream()
    buf = torch.empty(a.shape[0], b.shape[0], dtype=d, device=a.device)

    def run():
        with torch.cuda.stream(side):
            torch.mm(a, b.t(), out=buf)
        return buf
    return [torch_race.Candidate("planted_off_stream", "torch", 0, run)]


def wrong(kind):
    def extra(a, b, bias, d):
        good = torch.nn.functional.linear(a, b, bias).to(d)
        bad = good.clone()
        if kind == "one_element":
            bad.view(-1)[bad.numel() // 2] += 1000.0
        else:
            bad = (good.double() * 1.2 + 0.2).to(d)
        return [torch_race.Candidate(f"planted_{kind}", "torch", 0, lambda: bad)]
    return extra


def show(res, name):
    by = {c["name"]: c for c in res.candidates}
    c = by.get(name, {})
    return {"status": res.status, "winner": res.kernel_name, "planted_us": c.get("us"), "planted_error": c.get("error"),
            "planted_err_ratio": c.get("err_ratio"), "planted_final": c.get("final"), "reason": res.race.get("reason")}


class Neighbour:
    def __init__(self, device):
        self.device, self.p = device, None

    def start(self):
        env = {"CUDA_VISIBLE_DEVICES": str(self.device.index or 0), "PATH": "/usr/bin:/bin"}
        import os
        env = {**os.environ, **env}
        self.p = subprocess.Popen([sys.executable, "-c", NEIGHBOUR], stdout=subprocess.PIPE, text=True, env=env)
        assert self.p.stdout.readline().strip() == "go"  # looping on the GPU before the window is timed
        self.started = time.perf_counter()

    def stop(self):
        if self.p is not None:
            self.p.kill()
            self.p.wait()
            self.p = None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--out")
    a = p.parse_args()
    ident = detect(int(a.device.split(":")[1]))
    out: dict = {"device": torch.cuda.get_device_name(), "llc_bytes": ident.llc_bytes}
    backend = TorchBackend(device=a.device, repeats=30, warmup=5, candidate_limit_s=20, race="exhaustive",
                           only=[DEFAULT, "torch_mm_bt_contig", "planted_off_stream", "planted_one_element",
                                 "planted_past_tolerance"], llc_bytes=ident.llc_bytes)
    out["scrub_bytes"] = backend.timer.scrub_bytes()
    ls = lease(ident, 128, 4096, 4096)
    tune(backend, ls)  # warm-up: cuBLAS handles, the control kernel's baseline

    res, _ = tune(backend, ls, off_stream)
    out["off_stream"] = show(res, "planted_off_stream")
    real = torch_checks.check_output
    calls = {"n": 0}

    def blind_guard(o, r, d):  # the guard's check forced to pass for the planted candidate's replays only
        calls["n"] += 1
        got = real(o, r, d)
        return (0.0, None) if bool(torch.isnan(o.double()).any()) else got
    torch_checks.check_output = blind_guard  # type: ignore[assignment]
    try:
        res, _ = tune(backend, ls, off_stream)
        out["off_stream_unguarded"] = show(res, "planted_off_stream")
    finally:
        torch_checks.check_output = real  # type: ignore[assignment]
    for kind in ("one_element", "past_tolerance"):
        res, _ = tune(backend, ls, wrong(kind))
        out[kind] = show(res, f"planted_{kind}")
    print(json.dumps(out, indent=1), flush=True)

    # a busy neighbour started before window 3, gone once its window is flagged: re-timed, booked
    big = lease(ident, 2048, 8192, 8192)
    tune(backend, big)
    hog = Neighbour(backend.device)
    seen: list = []
    backend.timer.on_window = lambda w, att: (seen.append((w, att, time.perf_counter())),
                                              hog.start() if len(seen) == 3 else None)[-1]
    backend.timer.on_busy = lambda why: hog.stop()
    base = backend.timer.control_base
    controls: list = []  # every window's control median against the idle base and limit, and its verdict
    judged = backend.timer.window_state

    def window_state(control_s):
        bc = backend.timer.busy_check
        before = (bc.base, bc.limit()) if bc else (None, None)
        got = judged(control_s)
        controls.append({"control_us": control_s * 1e6, "base_us": before[0] and before[0] * 1e6,
                         "limit": before[1], "state": got[0], "why": got[1],
                         "neighbour": hog.p is not None})
        return got
    backend.timer.window_state = window_state  # type: ignore[method-assign]
    try:
        res, wall = tune(backend, big)
    finally:
        hog.stop()
    out["busy_retimed"] = {"status": res.status, "busy": res.race["busy"], "noisy": res.race["noisy"],
                           "windows": res.race["windows"],
                           "control_idle_us": base * 1e6 if base else None, "wall_s": wall,
                           "window_attempts": [(w, att) for w, att, _ in seen], "winner": res.kernel_name,
                           "controls": controls[:]}
    # a neighbour that stays: the lease goes back with the reason
    seen.clear()
    controls.clear()
    backend.timer.on_busy = None
    try:
        res, _ = tune(backend, big)
        out["busy_stays"] = {"handed_back": False, "status": res.status, "noisy": res.race["noisy"]}
    except GpuBusy as e:
        out["busy_stays"] = {"handed_back": True, "reason": str(e)}
    finally:
        hog.stop()
        out["busy_stays"]["controls"] = controls[:]
        controls.clear()
    # a neighbour already there before the race: the process check
    backend.timer.on_window = None
    backend.timer.watch.at = -float("inf")  # the process list read afresh before this race
    hog.start()
    try:
        out["processes_seen"] = vars(gpu_idle.list_processes(backend.device))
        res, _ = tune(backend, big)
        out["busy_before"] = {"handed_back": False, "status": res.status, "busy": res.race["busy"]}
    except GpuBusy as e:
        out["busy_before"] = {"handed_back": True, "reason": str(e)}
    finally:
        hog.stop()
    out["process_reads"] = {"reads": backend.timer.watch.reads, "seconds": backend.timer.watch.read_s}
    shown = ("process_reads", "busy_retimed", "busy_stays", "processes_seen", "busy_before")
    print(json.dumps({k: out[k] for k in shown}, indent=1), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
