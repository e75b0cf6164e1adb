"""The 100k-shape campaign page's first and repeat view (issue #15 item 5), as benchmarks/service_load.py times
them, alone and against another commit in the same run. Not a test: it prints figures.

    python benchmarks/campaign_page.py [--shapes 100000] [--rounds 3] [--before REF] [--no-sqlite] [--no-pg]

Per round, engine and checkout (this one, and REF's as a git worktree when --before): a fresh database and
server (the CLI's `serve`), a 2k then a --shapes CSV capture, then the page's first view (GET /campaigns/{id}:
its route, statements, overlay and cached data are cold), a wait until its totals are counted, the median
of 5 repeat views, and 20 live refreshes of the unchanged page (static/live.js: ?partial=1 with the tag it got,
answered 304) with the server's CPU per refresh. Rounds alternate the checkouts, so load drifting on a shared machine hits both alike.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.service_load import cpu_s, csv_capture, fresh_db, post_csv, start_pg, timed_get  # noqa: E402
from benchmarks.worktree import checkout  # noqa: E402
from tests.conftest import start_server  # noqa: E402


def views(root: Path, db_url: str, tmp: Path, shapes: int) -> tuple[float, float, float, float]:
    """The campaign page after a shapes-shape capture: (first view ms, median of 5 repeat views ms, and of the
    live refresh's 304 for an unchanged page: median ms of 20, the server's CPU ms per 304)."""
    env = {"TUNER_MAX_CAPTURE_SHAPES": str(shapes), "TUNER_MAX_CAMPAIGN_SHAPES": str(4 * shapes)}
    srv = start_server(db_url, tmp / "page.log", env, cwd=root)
    try:
        post_csv(srv.url, csv_capture(2000, 1))
        cid = post_csv(srv.url, csv_capture(shapes, 100))[1]["campaign_id"]
        first, page = timed_get(srv.url, f"/campaigns/{cid}")
        assert page.status_code == 200, page.text[:500]
        deadline = time.monotonic() + 300
        while "(counting)" in timed_get(srv.url, f"/campaigns/{cid}")[1].text:
            assert time.monotonic() < deadline, "the totals were never counted"
            time.sleep(0.5)
        repeat = statistics.median(timed_get(srv.url, f"/campaigns/{cid}")[0] for _ in range(5))
        live = {"params": {"partial": 1}}  # as static/live.js asks, with the tag it got
        tag = timed_get(srv.url, f"/campaigns/{cid}", **live)[1].headers["etag"]
        cpu0, same = cpu_s(srv.proc.pid), []
        for _ in range(20):
            ms, r = timed_get(srv.url, f"/campaigns/{cid}", headers={"If-None-Match": tag}, **live)
            assert r.status_code == 304, r.status_code
            same.append(ms)
        return first, repeat, statistics.median(same), (cpu_s(srv.proc.pid) - cpu0) / 20 * 1e3
    finally:
        srv.proc.terminate()
        srv.proc.wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--before", help="a git ref measured the same way, alternating with this checkout")
    p.add_argument("--no-sqlite", action="store_true")
    p.add_argument("--no-pg", action="store_true")
    p.add_argument("--pg-url", default=os.environ.get("TUNER_TEST_PG_URL"))
    a = p.parse_args()
    engines = [e for e, off in (("sqlite", a.no_sqlite), ("postgresql", a.no_pg)) if not off]
    pg, stop = a.pg_url, None
    if "postgresql" in engines and not pg:
        pg, stop = start_pg()
    tmp = Path(tempfile.mkdtemp())
    out: dict[tuple[str, str], list[tuple[float, float, float, float, str]]] = {}
    t0 = time.time()
    try:
        with checkout(a.before, tmp) as old:
            roots = ({f"before ({a.before})": old} if old else {}) | {"now": ROOT}
            for r in range(a.rounds):
                for e in engines:
                    for name, root in roots.items():
                        load = os.getloadavg()[0]
                        db = fresh_db(e, pg, tmp, f"page{r}{'n' if root == ROOT else 'b'}", upgrade=root == ROOT)
                        out.setdefault((e, name), []).append((*views(root, db, tmp, a.shapes), f"{load:.1f}"))
    finally:
        if stop:
            subprocess.run(stop, stdout=subprocess.DEVNULL)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"campaign page of a {a.shapes // 1000}k-shape campaign, first view / median of 5 repeat views / median "
          f"of 20 live refreshes answered 304 (ms) and the server's CPU per 304 (ms), per round (load average at "
          f"its start); machine: {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M', time.localtime(t0))}, "
          f"{(time.time() - t0) / 60:.1f} min")
    for (e, name), runs in out.items():
        med = [statistics.median(run[i] for run in runs) for i in range(4)]
        print(f"  {e:<10} {name:>22}  " + "   ".join(f"{f:4.0f} / {r:4.0f} / {s:4.0f} cpu {c:4.0f} (load {ld})"
                                                   for f, r, s, c, ld in runs)
              + f"   median first {med[0]:4.0f}, repeat {med[1]:4.0f}, 304 {med[2]:4.0f} cpu {med[3]:4.0f}")


if __name__ == "__main__":
    main()
