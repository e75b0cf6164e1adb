"""The views that read what AITER builds from an image's deployed tables (issue #15 item 5), in process: the
engagement report, the deploy plan and the campaign page of an image shipping big tables, first view (the
overlay and its artifacts built) against a repeat (kept: app/services/overlays.py), and after a new result
(built again). Not a test: it prints figures.

    python benchmarks/overlay_build.py [--family a8w8_blockscale_gemm] [--configs DIR] [--shapes 200] [--repeat 5]

--configs: an aiter/configs folder (default ../shared/aiter-configs beside the checkout, else
TUNER_AITER_CONFIGS, else the test fixtures, whose big tables are cut short). Every table of the family there is
reported as the image's; --shapes shapes are captured (under page_totals.INLINE_MAX, so each view counts every
shape within the request) and half of them tuned.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastapi.testclient import TestClient  # noqa: E402

from app.config import Settings  # noqa: E402
from app.domain.families import get_family  # noqa: E402
from app.domain.tables import read_table  # noqa: E402
from app.main import create_app  # noqa: E402
from app.services import overlays  # noqa: E402
from tests.conftest import DIGEST, capture  # noqa: E402
from tests.integration.test_leasing_api import lease, ok_row, plausible_us  # noqa: E402


def configs_dir(given: str | None) -> Path:
    for d in (given, ROOT.parent / "shared" / "aiter-configs", os.environ.get("TUNER_AITER_CONFIGS"),
              ROOT / "tests" / "fixtures" / "aiter" / "configs"):
        if d and Path(d).is_dir():
            return Path(d)
    raise SystemExit("no aiter/configs folder")


def timed(c: TestClient, path: str) -> tuple[float, float]:
    """(wall ms, process CPU ms) of one GET."""
    w, p = time.perf_counter(), time.process_time()
    r = c.get(path)
    assert r.status_code == 200, r.text[:300]
    return (time.perf_counter() - w) * 1e3, (time.process_time() - p) * 1e3


def tune(c: TestClient, n: int, fam: str) -> None:
    extra = {"kernelId": 1, "libtype": "ck", "errRatio": 0.0, "kernelName": "k_ck"} if "blockscale" in fam else {}
    while n > 0 and (r := lease(c, max_shapes=min(n, 50), budget_s=80_000)).status_code == 200:
        body = r.json()
        for item in body["shapes"]:
            res = c.post(f"/v1/leases/{body['lease_id']}/results",
                         json=ok_row(body, item, plausible_us(body, item, 1.0), **extra))
            assert res.status_code == 200, res.text
            n -= 1


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--family", default="a8w8_blockscale_gemm")
    p.add_argument("--configs")
    p.add_argument("--shapes", type=int, default=200)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    fam = get_family(a.family)
    conf = configs_dir(a.configs)
    files = [f for f in [conf / fam.tuned_file, conf / fam.untuned_file,
                         *sorted((conf / "model_configs").glob("*.csv"))]
             if f.is_file() and (f.name == fam.untuned_file or fam.merge_name in f.name)]
    tables = {str(f.relative_to(conf)): f.read_text() for f in files}
    rows = sum(len(read_table(t).rows) for k, t in tables.items() if "untuned" not in k)
    tmp = Path(tempfile.mkdtemp())
    app = create_app(Settings(database_url=f"sqlite:///{tmp / 'bench.db'}", auth=False,
                              max_capture_shapes=max(20_000, a.shapes)))
    with TestClient(app) as c:
        r = c.put(f"/v1/images/{DIGEST}/tables", json={"tables": tables, "configs_dir": "/opt/aiter/aiter/configs"})
        assert r.status_code == 200, r.text
        shapes = [{"M": m, "N": 7168, "K": 2048} for m in range(1, a.shapes + 1)]
        cid = capture(c, shapes, family=fam.name).json()["campaign_id"]
        tune(c, a.shapes // 2, fam.name)
        views = {"engagement": f"/v1/campaigns/{cid}/engagement?limit=50",
                 "deploy plan": f"/v1/overlays/{DIGEST}/{fam.name}/deploy",
                 "campaign page": f"/campaigns/{cid}"}
        c.get(f"/campaigns/{cid + 1000}")  # the page templates compiled before anything is timed
        out = {}
        for name, path in views.items():
            overlays._BUILT.clear()
            first = timed(c, path)
            again = [timed(c, path) for _ in range(a.repeat)]
            out[name] = (first, (statistics.median(x[0] for x in again), statistics.median(x[1] for x in again)))
        tune(c, 1, fam.name)  # a new result: the next view builds again
        builds = overlays._BUILT.builds
        moved = timed(c, views["engagement"])
        assert overlays._BUILT.builds == builds + 1
        overlays._BUILT.clear()
        tracemalloc.start()
        timed(c, views["engagement"])
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        weighed = overlays._BUILT.weight
    print(f"{fam.name}: {len(tables)} tables reported ({rows} tuned rows) from {conf}; {a.shapes} shapes, "
          f"{a.shapes // 2 + 1} tuned; machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    for name, ((fw, fc), (rw, rc)) in out.items():
        print(f"{name:>14}: first view {fw:7.0f} ms ({fc:7.0f} ms CPU)  repeat {rw:6.1f} ms ({rc:6.1f} ms CPU)  "
              f"{fw / rw:6.0f}x")
    print(f"{'new result':>14}: engagement {moved[0]:7.0f} ms (built again)")
    print(f"{'kept':>14}: {held / 1e6:.0f} MB for this image's overlay with its artifacts, lookups and digests "
          f"(tracemalloc, {held / max(rows, 1) / 1e3:.1f} kB per shipped row); weighed as {weighed / 1e3:.0f} MB "
          f"of overlays.MAX_MB={overlays.MAX_MB}")


if __name__ == "__main__":
    main()
