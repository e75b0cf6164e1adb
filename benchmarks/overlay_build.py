"""The views that read what AITER builds from an image's deployed tables (issue #15 item 5), in process: the
engagement report, the deploy plan and the campaign page of an image shipping big tables, first view (the
overlay and its artifacts built) against a repeat (kept: app/services/overlays.py), and after a new result
(built again, on the shipped tables kept from the build before). Not a test: it prints figures.

    python benchmarks/overlay_build.py [--family a8w8_blockscale_gemm] [--configs DIR] [--shapes 200] [--repeat 5]
                                       [--before REF]

--configs: an aiter/configs folder (default ../shared/aiter-configs beside the checkout, else
TUNER_AITER_CONFIGS, else the test fixtures, whose big tables are cut short). Every table of the family there is
reported as the image's; --shapes shapes are captured (under page_totals.INLINE_MAX, so each view counts every
shape within the request) and half of them tuned; then --repeat times per view a new result and the view.
--before REF: the same on a checkout of REF (git worktree), in a process of its own, in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(os.environ.get("OVERLAY_BUILD_ROOT") or Path(__file__).resolve().parents[1])  # --before: REF's
sys.path.insert(0, str(ROOT))

from fastapi.testclient import TestClient  # noqa: E402

from app.config import Settings  # noqa: E402
from app.domain.families import get_family  # noqa: E402
from app.domain.tables import read_table  # noqa: E402
from app.main import create_app  # noqa: E402
from app.services.caches import OVERLAYS_MAX_MB  # noqa: E402
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


def measure(a: argparse.Namespace) -> dict:
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
            app.state.caches.built.clear()
            first = timed(c, path)
            again = [timed(c, path) for _ in range(a.repeat)]
            out[name] = {"first": first, "repeat": (statistics.median(x[0] for x in again),
                                                    statistics.median(x[1] for x in again))}
        for name, path in views.items():  # a new result before each: the view builds again
            moved = []
            for _ in range(a.repeat):
                tune(c, 1, fam.name)
                builds = app.state.caches.built.builds
                moved.append(timed(c, path))
                assert app.state.caches.built.builds == builds + 1
            out[name]["moved"] = (statistics.median(x[0] for x in moved), statistics.median(x[1] for x in moved))
        app.state.caches.built.clear()
        tracemalloc.start()
        timed(c, views["engagement"])
        tune(c, 1, fam.name)
        timed(c, views["engagement"])  # what is held after a rebuild: the kept tables and the new overlay
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        weighed = app.state.caches.built.weight
    return {"views": out, "held": held, "weighed": weighed, "rows": rows, "tables": len(tables), "conf": str(conf)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--family", default="a8w8_blockscale_gemm")
    p.add_argument("--configs")
    p.add_argument("--shapes", type=int, default=200)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--before", help="a git ref to measure the same way in the same run")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # --before's child: figures as JSON
    a = p.parse_args()
    if a.json:
        print(json.dumps(measure(a)))
        return
    from benchmarks.worktree import checkout  # not at the top: a --before child's path has REF's tree first

    runs = {}
    with checkout(a.before, Path(tempfile.mkdtemp())) as old:
        if old:
            args = [sys.executable, __file__, "--json", "--family", a.family, "--shapes", str(a.shapes),
                    "--repeat", str(a.repeat), "--configs", str(configs_dir(a.configs))]
            out = subprocess.run(args, env={**os.environ, "OVERLAY_BUILD_ROOT": str(old)}, check=True,
                                 capture_output=True, text=True).stdout
            runs[f"before ({a.before})"] = json.loads(out.splitlines()[-1])
    runs["now"] = now = measure(a)
    print(f"{a.family}: {now['tables']} tables reported ({now['rows']} tuned rows) from {now['conf']}; {a.shapes} "
          f"shapes, {a.shapes // 2} tuned, then a result before each 'after a new result' view; machine: "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M')}")
    for run, m in runs.items():
        print(run)
        for name, v in m["views"].items():
            (fw, fc), (rw, rc), (mw, mc) = v["first"], v["repeat"], v["moved"]
            print(f"{name:>14}: first view {fw:7.0f} ms ({fc:7.0f} ms CPU)  repeat {rw:6.1f} ms ({rc:6.1f} ms CPU)  "
                  f"after a new result {mw:6.0f} ms ({mc:6.0f} ms CPU)")
        print(f"{'kept':>14}: {m['held'] / 1e6:.0f} MB for this image's overlay with its artifacts, lookups and "
              f"digests, after one rebuild (tracemalloc, {m['held'] / max(m['rows'], 1) / 1e3:.1f} kB per shipped "
              f"row); weighed as {m['weighed'] / 1e3:.0f} MB of OVERLAYS_MAX_MB={OVERLAYS_MAX_MB}")
    if a.before:
        then = list(runs.values())[0]
        for name, v in now["views"].items():
            b = then["views"][name]
            print(f"{name}: after a new result {b['moved'][1] / v['moved'][1]:.1f}x less CPU; first view "
                  f"{b['first'][1] / v['first'][1]:.1f}x, repeat {b['repeat'][1] / v['repeat'][1]:.1f}x")


if __name__ == "__main__":
    main()
