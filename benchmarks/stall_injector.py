"""A node that stalls now and then (issue 32's stall-robust drive): every U(MIN, MAX) seconds, one busy process per
CPU for U(0.3, 1.0) s, so everything else on the machine (the A/B's servers and driver) wakes late. At nice -20
(the default) the scheduler still shares the CPUs (measured: the driver's loop woke at most ~0.13 s late, passes
barely moved); with --rt the spinners run SCHED_FIFO, which holds every ordinary process off the CPUs for the
stall (the kernel's RT throttling leaves them 5%): a frozen node, as a VM's steal or a host hiccup makes one.
Prints one line per stall (start, length) so a run's stalls can be set beside its passes.

    nice -n -20 python3 benchmarks/stall_injector.py [--every 8:20] [--seconds 3600] [--rt]   (--rt: as root)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import time


def _spin(until: float, rt: bool) -> None:
    if rt:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
    while time.monotonic() < until:
        pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--every", default="8:20", help="MIN:MAX seconds between stalls")
    p.add_argument("--seconds", type=float, default=3600.0, help="stop after this long")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rt", action="store_true", help="SCHED_FIFO spinners: a frozen node (root)")
    a = p.parse_args()
    lo, hi = (float(x) for x in a.every.split(":"))
    rng, end = random.Random(a.seed), time.monotonic() + a.seconds
    while time.monotonic() < end:
        time.sleep(rng.uniform(lo, hi))
        length = rng.uniform(0.3, 1.0)
        until = time.monotonic() + length
        procs = [mp.Process(target=_spin, args=(until, a.rt)) for _ in range(os.cpu_count() or 1)]
        for x in procs:
            x.start()
        for x in procs:
            x.join()
        print(f"{time.time():.1f} stall {length:.2f} s", flush=True)


if __name__ == "__main__":
    main()
