"""No blocking work on the event loop: while a large capture is parsed and stored (seconds), the server still
answers /healthz at once (a parse on the loop froze every request, heartbeats too, for its length)."""

from __future__ import annotations

import threading
import time

import pytest

from tests.conftest import DIGEST, start_server

pytestmark = pytest.mark.e2e
CSV = "M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle\n" + "".join(
    f"{m},{n},64,False,torch.bfloat16,torch.bfloat16,False,False\n" for m in range(1, 601) for n in range(64, 6464, 64))  # 60,000 shapes, 3.6 MB


def test_a_large_capture_does_not_stall_other_requests(tmp_path):
    srv = start_server(f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path / "server.log",
                       {"TUNER_MAX_CAPTURE_SHAPES": "100000"})
    try:
        with srv.client() as c:
            took: list[float] = []

            def post() -> None:  # 19 s beside eight busy loops: the client's 30 s default was a guess at load
                t = time.monotonic()
                r = c.post("/v1/captures", content=CSV, headers={"content-type": "text/csv"}, timeout=240,
                           params={"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304, "family": "bf16_gemm"})
                took.append(time.monotonic() - t)
                assert r.status_code == 201, r.text

            big = threading.Thread(target=post)
            big.start()
            waits = []
            with srv.client() as probe:
                while big.is_alive():
                    t = time.monotonic()
                    assert probe.get("/healthz").status_code == 200
                    waits.append(time.monotonic() - t)
                    time.sleep(0.05)
            big.join()
        print(f"capture of 60,000 shapes: {took[0]:.1f} s; /healthz meanwhile: {len(waits)} answers, "
              f"slowest {max(waits) * 1000:.0f} ms")
        # the stall is judged against the capture's own length, since load stretches both alike: the slowest
        # answer is ~5% of it (0.23 s of 4 s idle, 0.92 s of 19 s beside eight busy loops, where a fixed 1 s
        # bound nearly failed); with the work on the loop it is the whole capture (5.5 s of 5.5 s). Five answers
        # at least: the capture lasted long enough to be probed (a fixed lower bound on its length would fail a
        # machine a few times faster than this one)
        assert len(waits) >= 5 and max(waits) < took[0] / 5
    finally:
        srv.proc.kill()
        srv.proc.wait()
