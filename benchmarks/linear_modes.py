"""Why F.linear's capture windows differ (issue 50, session 21): on an H100, M=320 N=6144 K=2048 timed 20.7-21.4 us
in most capture windows and 15.9-16.4 us in some (8 of 25), while a Triton config read 20.1-20.4 us in every one;
that bimodality decided a near-tie one way in one run and the other way in the next.

Each window here is what the race's final round does for one candidate (TorchBackend._final, Timer._graph): a
fresh capture of GRAPH_CALLS calls, then samples interleaved with the control kernel, each from a flushed L2. Per
window it records the median time, the SM clock, the kernels one replay launches (torch.profiler) and where the
inputs and the graph's output lie. Four ways, to tell what is chosen at capture from what the placement does:
- fresh: fresh copies of the inputs and a fresh capture (the race's windows after the first, placement "clone");
- shift: the same, each copy at a random offset of its own (placement "shift", torch_candidates.shifted);
- recapture: the same inputs, a fresh capture;
- replay: one capture, replayed in every window.
Run: python benchmarks/linear_modes.py --device cuda:0 [--shape 320,6144,2048 ...] [--windows 25] [--out f.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from workers.backends.torch_candidates import DEFAULT, MM_BT, candidates, shifted  # noqa: E402
from workers import gpu_idle  # noqa: E402
from workers.backends.torch_timer import Timer  # noqa: E402

# issue 50's four misses in session 21's headline run 2 (benchmarks/issue50_s21)
SHAPES = [(320, 6144, 2048), (64, 6144, 2048), (512, 2112, 7168), (2048, 6400, 5120)]
CLOCK = None  # the SM clock's reader (gpu_idle.sm_clock), read once a window


def kernels(replay) -> list[str]:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    return sorted({e.name[:120] for e in prof.events() if e.device_type.name == "CUDA"})


def window(timer: Timer, fn, samples: int, graph=None) -> dict:
    """One capture window of fn (or a graph already captured): median us a call, the control's, kernels."""
    g, out = graph or timer._graph(fn)
    got = timer.sample([(g.replay, Timer.GRAPH_CALLS), timer.control()], samples)
    return {"us": statistics.median(got[0]) * 1e6, "control_us": statistics.median(got[1]) * 1e6,
            "sm_mhz": CLOCK() if CLOCK else None, "kernels": kernels(g.replay), "out_ptr": hex(out.data_ptr()),
            "graph": (g, out)}


def modes(timer: Timer, m: int, n: int, k: int, windows: int, samples: int) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(m * 31 + n * 17 + k)
    a = torch.randn(m, k, generator=gen).to(timer.device, torch.bfloat16)
    b = (torch.randn(n, k, generator=gen) / k ** 0.5).to(timer.device, torch.bfloat16)
    out: dict[str, list[dict]] = {}
    rng = random.Random(0)

    def place(t: torch.Tensor) -> torch.Tensor:
        return shifted(t, rng)
    for name in (DEFAULT, MM_BT):
        def fn_over(x, y, name=name, shift=False):
            return next(c for c in candidates(x, y, None, torch.bfloat16, place if shift else None)
                        if c.name == name).fn
        fixed = fn_over(a, b)
        eager = kernels(fixed)
        kept = window(timer, fixed, samples)
        for way in ("fresh", "shift", "recapture", "replay"):
            rows = []
            for _ in range(windows):
                if way in ("fresh", "shift"):
                    x, y = (place(a), place(b)) if way == "shift" else (a.clone(), b.clone())
                    w = window(timer, fn_over(x, y, shift=way == "shift"), samples)
                    w.update(a_ptr=hex(x.data_ptr()), b_ptr=hex(y.data_ptr()))
                    del x, y  # freed before the next window's copies are made, as the race's are (_fresh)
                else:
                    w = window(timer, fixed, samples, kept["graph"] if way == "replay" else None)
                w.pop("graph")
                rows.append(w)
            out[f"{name} {way}"] = rows
            us = [r["us"] for r in rows]
            print(f"{m:>5} {n:>6} {k:>6} {name:<20} {way:<9} us min {min(us):7.2f} median {statistics.median(us):7.2f}"
                  f" max {max(us):7.2f}; kernel sets {len({tuple(r['kernels']) for r in rows})}; eager {eager}",
                  flush=True)
            for r in rows:
                print(f"      {r['us']:7.2f} us (control {r['control_us']:5.2f}, {r['sm_mhz']} MHz) {r['kernels']} "
                      f"out {r['out_ptr']}"
                      + (f" a {r['a_ptr']} b {r['b_ptr']}" if "a_ptr" in r else ""), flush=True)
        out[f"{name} eager kernels"] = eager  # type: ignore[assignment]
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--shape", action="append", help="M,N,K (repeatable); default: the four misses")
    p.add_argument("--windows", type=int, default=25)
    p.add_argument("--samples", type=int, default=6, help="samples a window (the race's final round: 30 / 5)")
    p.add_argument("--out")
    a = p.parse_args()
    if not a.device.startswith("cuda") or not torch.cuda.is_available():
        sys.exit("linear_modes.py times CUDA graphs: it needs a GPU (--device cuda:N)")
    global CLOCK
    timer = Timer(torch.device(a.device))
    timer.ready()
    CLOCK = gpu_idle.sm_clock(timer.device)
    shapes = [tuple(int(v) for v in s.split(",")) for s in a.shape] if a.shape else SHAPES
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(timer.device)}", flush=True)
    got = {f"{m}x{n}x{k}": modes(timer, m, n, k, a.windows, a.samples) for m, n, k in shapes}
    if a.out:
        Path(a.out).write_text(json.dumps(got, indent=1))


if __name__ == "__main__":
    main()
