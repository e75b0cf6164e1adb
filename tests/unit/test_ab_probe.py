"""The driver's node probe (app/ab_driver.py LagProbe): a host that stalls the driver's event loop during a pass
shows in the pass's probe, and the pass is measured again; an idle loop reads next to no lag."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.ab_driver import PROBE_SLEEP_S, STALL_RETRIES, STALL_S, ArmServer, Driver, LagProbe
from app.ab_wire import OperatingPoint, RequestRecord


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


class FakeLoad:
    """drive_band as the driver calls it; the first `stalls` passes hold the event loop stall_s (a stalled node)."""

    def __init__(self, stalls: int, stall_s: float = 0.25):
        self.calls, self.stalls, self.stall_s = 0, stalls, stall_s

    async def drive_band(self, url, model, point, *, arm, repeat, n_requests, seed, started_at, timeout_s):
        self.calls += 1
        await asyncio.sleep(0.05)
        if self.calls <= self.stalls:
            time.sleep(self.stall_s)
        await asyncio.sleep(0.05)
        return [RequestRecord(arm=arm, band=point.name, repeat=repeat, started_s=0.0, ttft_s=0.01, latency_s=0.1,
                              output_tokens=self.calls)]  # which try this is, in its tokens


def post_one_pass(tmp_path, load, **kw):
    d = Driver("http://127.0.0.1:9", None, 1, model="m", workdir=tmp_path, **kw)
    d.servers["A"] = ArmServer("A", "http://127.0.0.1:9", [])
    posted = []

    async def svc(c, method, path, **k):
        posted.append(k["json"])

    async def alive(srv):
        return None

    d._svc, d._alive = svc, alive
    point = OperatingPoint(concurrency=1, input_len=1, output_len=1)
    asyncio.run(d._pass(None, load, point, point.name, 0, "A", 0, 1))
    (one,) = posted
    return one


def test_a_pass_the_node_stalled_in_is_measured_again_and_only_the_clean_one_posted(tmp_path):
    one = post_one_pass(tmp_path, FakeLoad(stalls=1))
    assert one["records"][0]["output_tokens"] == 2  # the second try's
    assert one["probe"]["stalled_passes"] == 1 and one["probe"]["lag_max_s"] < STALL_S


def test_a_node_that_stalls_every_try_still_gets_its_pass_posted_with_the_probe_saying_so(tmp_path):
    one = post_one_pass(tmp_path, FakeLoad(stalls=9))
    assert one["records"][0]["output_tokens"] == STALL_RETRIES + 1
    assert one["probe"]["stalled_passes"] == STALL_RETRIES and one["probe"]["lag_max_s"] > STALL_S


def test_without_a_stall_limit_the_first_try_is_posted(tmp_path):
    one = post_one_pass(tmp_path, FakeLoad(stalls=1), stall_s=None)
    assert one["records"][0]["output_tokens"] == 1 and one["probe"]["stalled_passes"] == 0


def test_on_a_node_whose_ordinary_lag_is_high_only_the_unusual_pass_counts_as_stalled(tmp_path):
    d = Driver("http://127.0.0.1:9", None, 1, model="m", workdir=tmp_path)
    assert d.stall_limit() == STALL_S
    d.lags = [0.15, 0.2, 0.18, 0.16, 0.17]  # a busy host: every pass wakes 0.15-0.2 s late
    assert d.stall_limit() == pytest.approx(5 * 0.17)
    d.lags = [0.001] * 5  # a quiet one: the floor
    assert d.stall_limit() == STALL_S
