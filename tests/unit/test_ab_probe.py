"""The driver's node probe (app/ab_driver.py LagProbe): a host that stalls the driver's event loop during a pass
shows in the pass's probe; an idle loop reads next to no lag."""

from __future__ import annotations

import asyncio
import time

from app.ab_driver import PROBE_SLEEP_S, LagProbe


def probe_while(stall_s: float, run_s: float = 0.3):
    async def main():
        with LagProbe() as p:
            await asyncio.sleep(run_s / 2)
            time.sleep(stall_s)  # the loop is held: what a stalled node does to every process on it
            await asyncio.sleep(run_s / 2)
        return p.result()

    return asyncio.run(main())


def test_a_stall_shows_as_the_probe_s_largest_lag():
    stalled = probe_while(0.25)
    assert stalled.samples >= 2 and stalled.lag_max_s >= 0.25 - PROBE_SLEEP_S
    assert stalled.lag_mean_s <= stalled.lag_max_s


def test_no_stall_reads_less_lag_than_a_stall():
    assert probe_while(0.0).lag_max_s < probe_while(0.25).lag_max_s
