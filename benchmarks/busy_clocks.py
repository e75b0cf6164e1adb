"""Does the busy check's control kernel slow down with the card's own state (clocks, heat, power) after heavy work,
and does it in the same way when a neighbour shares the card? (issue 50: an idle, dedicated H100 read +15.6%
"busy" after large shapes had run.)

Phases, each printing one JSON line per reading: the control kernel's median (Timer.control, the race's own
1024^3 bf16 graph, flushed L2, 10 calls a sample) with the SM clock, temperature, power and throttle reasons
that nvidia-smi reports at that moment:
  idle     the card cold, 10 readings
  heavy    --heavy-s seconds of back-to-back M=6144 N=12288 K=5120 bf16 GEMMs (a large prefill shape), then at
           once 20 readings, one a second (the card's own state, nothing else on it)
  shared   a second process runs the same heavy GEMMs while 10 readings are taken (a neighbour)
  after    the neighbour gone, 10 readings

    python3 benchmarks/busy_clocks.py --heavy-s 60 > busy_clocks.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from workers.backends.torch_timer import Timer  # noqa: E402

FIELDS = "clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active"


def card() -> dict[str, str]:
    out = subprocess.run(["nvidia-smi", "-i", "0", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout.strip()
    return dict(zip(["sm_mhz", "mem_mhz", "temp_c", "power_w", "throttle"], [x.strip() for x in out.split(",")]))


def heavy(seconds: float) -> None:
    a = torch.randn(6144, 5120, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(12288, 5120, device="cuda", dtype=torch.bfloat16)
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(20):
            a @ b.t()
        torch.cuda.synchronize()


def reading(timer: Timer, phase: str, i: int) -> None:
    ctl = timer.control()
    med = statistics.median(timer.sample([ctl], 30)[0])
    print(json.dumps({"phase": phase, "i": i, "control_us": round(med * 1e6, 3), **card()}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heavy-s", type=float, default=60)
    ap.add_argument("--neighbour", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.neighbour:
        heavy(3600)
        return
    timer = Timer(torch.device("cuda:0"))
    for i in range(10):
        reading(timer, "idle", i)
        time.sleep(0.5)
    heavy(args.heavy_s)
    for i in range(20):
        reading(timer, "heavy", i)
        time.sleep(1.0)
    nb = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--neighbour"])
    time.sleep(5)
    for i in range(10):
        reading(timer, "shared", i)
        time.sleep(0.5)
    nb.kill()
    nb.wait()
    time.sleep(2)
    for i in range(10):
        reading(timer, "after", i)
        time.sleep(0.5)


if __name__ == "__main__":
    main()
