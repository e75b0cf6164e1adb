"""The engagement report's first page on a 100k-shape campaign (issue #15 item 5): does a page cost in
proportion to the page? Not a test: it prints figures.

    python benchmarks/engagement_page.py [--shapes 100000] [--before REF] [--ship] [--postgresql [--pg-url URL]]

One service (uvicorn, the CLI's flags) on a fresh SQLite (or PostgreSQL: a throwaway one as
benchmarks/service_load.py starts, unless --pg-url) database holding one campaign of --shapes captured
shapes (the same CSV capture as benchmarks/service_load.py). Timed, for GET /v1/campaigns/{id}/engagement
and for POST of a small supplied table (and the campaign page, HTML, beside them): the first view, how long
until its totals over every shape are counted (a background count since the report pages; the first view
says `totals_pending`, the page "(counting)"), and a repeat view (median of 3) once they are. --before REF: the same on a checkout of REF (git worktree) in the same run, its
server started the same way, and the totals of both compared. --ship: the image reports AITER's shipped bf16
tables before the capture, so each view reads what AITER builds from them (kept built since the overlay cache).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.overlay_build import configs_dir  # noqa: E402
from benchmarks.service_load import AUTH, DIGEST, csv_capture, fresh_db, post_csv, start_pg, timed_get  # noqa: E402
from benchmarks.worktree import checkout  # noqa: E402
from tests.conftest import start_server  # noqa: E402

TABLE = ("gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,kernelName,err_ratio,"
         "tflops,bw\ngfx942,304,1,6400,4096,False,torch.bfloat16,torch.bfloat16,False,False,hipblaslt,1,0,5.0,"
         "k_one,0.0,1.0,1.0\n")
TOTALS = ("hits", "misses", "served_time_covered")
PREDICTED = re.compile(r'id="predicted">.*?(\(counting\)|\d+)(?:</i>)?\s+of (\d+) captured', re.S)


def pending(r: httpx.Response) -> bool:
    """The totals over every shape are still being counted (the campaign page says "(counting)")."""
    return "(counting)" in r.text if r.headers["content-type"].startswith("text/html") else bool(r.json().get("totals_pending"))


def timed_post(base: str, path: str, text: str) -> tuple[float, httpx.Response]:
    t0 = time.perf_counter()
    r = httpx.post(base + path, content=text.encode(), timeout=600, headers={**AUTH, "content-type": "text/csv"})
    return (time.perf_counter() - t0) * 1e3, r


def shipped_bf16() -> dict[str, str]:
    """AITER's shipped bf16 tables (the default and model_configs), as a worker reports them."""
    conf = configs_dir(None)
    files = [conf / "bf16_tuned_gemm.csv", *sorted((conf / "model_configs").glob("*bf16_tuned_gemm*.csv"))]
    return {str(f.relative_to(conf)): f.read_text() for f in files if f.is_file()}


def measure(root: Path, db_url: str, tmp: Path, name: str, shapes: int, ship: bool = False) -> dict:
    env = {"TUNER_MAX_CAPTURE_SHAPES": str(shapes), "TUNER_MAX_CAMPAIGN_SHAPES": str(2 * shapes)}
    srv = start_server(db_url, tmp / f"{name}.log", env, cwd=root)
    out: dict = {}
    try:
        if ship:
            httpx.put(f"{srv.url}/v1/images/{DIGEST}/tables", json={"tables": shipped_bf16()}, headers=AUTH,
                      timeout=600).raise_for_status()
        cid = post_csv(srv.url, csv_capture(shapes, 100))[1]["campaign_id"]
        path = f"/v1/campaigns/{cid}/engagement"
        for what, view in (("GET", lambda: timed_get(srv.url, path)),
                           ("POST table", lambda: timed_post(srv.url, path, TABLE)),
                           ("page HTML", lambda: timed_get(srv.url, f"/campaigns/{cid}"))):
            ms_first, first = view()
            assert first.status_code == 200, first.text[:500]
            t0 = time.perf_counter()
            last = first
            while pending(last):
                time.sleep(0.2)
                last = view()[1]
            counted = time.perf_counter() - t0
            runs = sorted((view() for _ in range(3)), key=lambda r: r[0])
            ms, again = runs[1]
            html = what == "page HTML"
            out[what] = {"first_ms": ms_first, "first_kB": len(first.content) / 1e3, "first_pending": pending(first),
                         "counted_s": counted, "repeat_ms": ms, "repeat_kB": len(again.content) / 1e3,
                         "totals": PREDICTED.search(again.text).group(1) if html
                         else {k: again.json()[k] for k in TOTALS},
                         "rows": again.text.count('class="shape"') if html else len(again.json()["report"])}
    finally:
        srv.proc.terminate()
        srv.proc.wait()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", type=int, default=100_000)
    p.add_argument("--before", help="a git ref to measure the same way in the same run (e.g. the commit before)")
    p.add_argument("--postgresql", action="store_true")
    p.add_argument("--ship", action="store_true", help="the image reports AITER's shipped bf16 tables first "
                   "(../shared/aiter-configs, else TUNER_AITER_CONFIGS, else the fixtures): each view merges them")
    p.add_argument("--pg-url", default=os.environ.get("TUNER_TEST_PG_URL"))
    a = p.parse_args()
    kind, pg, stop = ("postgresql" if a.postgresql else "sqlite"), a.pg_url, None
    if a.postgresql and not pg:
        pg, stop = start_pg()
    tmp = Path(tempfile.mkdtemp())
    runs = {}
    try:
        with checkout(a.before, tmp) as old:
            if old:
                runs[f"before ({a.before})"] = measure(old, fresh_db(kind, pg, tmp, "before", upgrade=False), tmp,
                                                   "before", a.shapes, a.ship)
            runs["now"] = measure(ROOT, fresh_db(kind, pg, tmp, "now"), tmp, "now", a.shapes, a.ship)
    finally:
        if stop:
            subprocess.run(stop, stdout=subprocess.DEVNULL)
        shutil.rmtree(tmp, ignore_errors=True)
    shipped = f", the image reporting {sum(len(t.splitlines()) - 1 for t in shipped_bf16().values())} shipped bf16 rows" \
        if a.ship else ""
    print(f"engagement report, first page of a {a.shapes // 1000}k-shape campaign ({kind}{shipped}); machine: "
          f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M')}")
    for name, r in runs.items():
        for what, m in r.items():
            print(f"{name:>22} {what:<10}  first view {m['first_ms']:7.0f} ms {m['first_kB']:6.0f} kB"
                  f"{' (totals pending)' if m['first_pending'] else '':<17}  totals counted {m['counted_s']:5.1f} s "
                  f"later  repeat view {m['repeat_ms']:6.0f} ms {m['repeat_kB']:5.0f} kB  {m['rows']} rows  "
                  f"totals {m['totals']}")
    if a.before:
        (b, then), now = list(runs.items())[0], runs["now"]
        for what in now:
            print(f"{what}: first view {then[what]['first_ms'] / now[what]['first_ms']:.1f}x faster, repeat view "
                  f"{then[what]['repeat_ms'] / now[what]['repeat_ms']:.1f}x faster; totals "
                  f"{'equal' if then[what]['totals'] == now[what]['totals'] else 'DIFFER'}")


if __name__ == "__main__":
    main()
