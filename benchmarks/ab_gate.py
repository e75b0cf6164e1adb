"""The serving A/B gate, repeated (issue 32): does it find exactly the planted bands, does the identical-arm
control stay quiet, does the rollback withdraw exactly the rows serving the regressing band, and is the
rolled-back version promotable on its re-run?

Everything is real processes on this machine: the service (SQLite), the driver (app/ab_driver.py, in this
process) and, per arm, the planted-effect stand-in server (tests/fixtures/ab_standin_server.py: +8% output tok/s
at concurrency >= 16 and -3% at <= 2 when its AITER_CONFIG_* files hold rows serving those batch sizes, none
between, with noise and slow drift). The overlay and bands: tests/e2e/test_ab_gate.py (rows at M = 1, 2, 16, 64;
bands c2: -3%, c8: none, c16: +8%; the rollback of c2 withdraws M = 1, 2 and 16, whose padded bucket serves 1..2).

Each gate: a run of the version against the shipped tables; its regressing band proposes a rollback version; a
run of that version. Prints one JSON line per gate and a summary (rates with Wilson 95% intervals, the effect
estimates' spread), which goes to benchmarks/RESULTS.md.

    PYTHONPATH=. .venv/bin/python benchmarks/ab_gate.py [--gates 20] [--repeats 8] [--requests 8] [--standin-args '--token-ms 40']

Gates can run as parallel shards where CPUs are free (--first-gate N --gates K each, own service and seeds);
--summarize FILE... then reads their per-gate JSON lines and prints the one summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.ab_driver import Driver, Fault  # noqa: E402
from app.domain.ab_stats import PRIMARY  # noqa: E402
from tests.conftest import DIGEST, start_server  # noqa: E402
from tests.e2e.test_ab_gate import BANDS, GATE, MODEL, RANKS, ROWS_M, WITHDRAWN_M, launch  # noqa: E402
from tests.integration.test_ab_api import seed_overlay  # noqa: E402

ADMIN = "atk_test-admin-token"
POINT_KEYS = ("concurrency", "input_len", "output_len", "requests")


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def drive(url: str, run_id: int, work: Path, extra: str) -> dict:
    d = Driver(url, ADMIN, run_id, model=MODEL, workdir=work, launch=launch(extra), ranks=RANKS,
               health_timeout_s=60)
    try:
        return asyncio.run(d.run())
    finally:
        d.stop()


def band_figures(res: dict) -> dict:
    """Per band: the verdict metric's effect, interval and MDE (B vs A), the control's effect, the rounds measured,
    and the pass throughput's effect (output tok/s, reported beside it)."""
    bands = [b for b in res.get("bands", []) if b["effect"]]
    return {"effects": {b["band"]: b["effect"][PRIMARY]["effect"] for b in bands},
            "intervals": {b["band"]: [b["effect"][PRIMARY]["lo"], b["effect"][PRIMARY]["hi"]] for b in bands},
            "controls": {b["band"]: b["control"][PRIMARY]["effect"] for b in bands},
            "mde": {b["band"]: b["effect"][PRIMARY]["mde"] for b in bands},
            "rounds": {b["band"]: b["rounds"] for b in bands},
            "output_tok_s": {b["band"]: b["effect"]["output_tok_s"]["effect"] for b in bands}}


def run_once(c, url: str, version_id: int, seed: int, args, work: Path) -> dict:
    body = {"image_digest": DIGEST, "version_id": version_id, "baseline": "shipped", "points": args.points,
            "repeats": args.repeats, "requests_per_pass": args.requests, "seed": seed,
            "confidence": args.confidence}
    run = c.post("/v1/ab/runs", json=body).json()
    t = time.monotonic()
    try:
        out = drive(url, run["id"], work, args.standin_args)
    except Fault as e:
        out = c.get(f"/v1/ab/runs/{run['id']}").json()
        out["fault"] = str(e)
    out["seconds"] = time.monotonic() - t
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--gates", type=int, default=20)
    p.add_argument("--first-gate", type=int, default=0, help="number of the first gate (its seeds): shards")
    p.add_argument("--summarize", nargs="+", metavar="FILE", help="no runs: the summary of these per-gate lines")
    p.add_argument("--repeats", type=int, default=GATE["repeats"])
    p.add_argument("--requests", type=int, default=GATE["requests_per_pass"])
    p.add_argument("--standin-args", default=GATE["token_ms"], help="more flags for the stand-in server")
    p.add_argument("--confidence", type=float, default=GATE["confidence"])
    p.add_argument("--points", default=",".join(":".join(str(x[k]) for k in POINT_KEYS if k in x) for x in GATE["points"]),
                   help="the bands, CONCURRENCY:INPUT_LEN:OUTPUT_LEN[:REQUESTS_PER_PASS],... (concurrencies 2, 8, "
                        "16: the planted ones)")
    args = p.parse_args()
    args.points = [dict(zip(POINT_KEYS, map(int, x.split(":")))) for x in args.points.split(",")]
    expected = {f"c{x['concurrency']}-i{x['input_len']}-o{x['output_len']}": v
                for x, v in zip(args.points, BANDS.values())}
    if args.summarize:
        rows = [json.loads(line) for f in args.summarize for line in Path(f).read_text().splitlines()
                if line.startswith('{"gate"')]
        return summarize(rows, expected)
    tmp = Path(tempfile.mkdtemp(prefix="ab_gate_"))
    srv = start_server(f"sqlite:///{tmp / 'svc.db'}", tmp / "svc.log")
    rows = []
    try:
        c = srv.client()
        seed_overlay(c, ROWS_M)
        v = c.post("/v1/ab/versions", json={"image_digest": DIGEST}).json()
        for g in range(args.first_gate, args.first_gate + args.gates):
            first = run_once(c, srv.url, v["id"], 1000 + g, args, tmp / f"g{g}a")
            res = first.get("result") or {}
            got = {b["band"]: b["verdict"] for b in res.get("bands", [])}
            row = {"gate": g, "verdict": first.get("verdict"), "reason": first.get("reason"), "bands": got,
                   "exact": got == expected, "control_flagged": res.get("control_flagged", []),
                   **band_figures(res), "seconds": round(first["seconds"], 1)}
            rb_id = first.get("rollback_version_id")
            if rb_id:
                rb = c.get(f"/v1/ab/versions/{rb_id}").json()
                row["withdrawn_M"] = sorted(int(w["row"]["M"]) for w in rb["withdrawn"] or [])
                second = run_once(c, srv.url, rb_id, 5000 + g, args, tmp / f"g{g}b")
                res2 = second.get("result") or {}
                row["rerun_bands"] = {b["band"]: b["verdict"] for b in res2.get("bands", [])}
                row["rerun"] = band_figures(res2) | {"control_flagged": res2.get("control_flagged", [])}
                row["rerun_promotable_reason"] = res2.get("promotable")
                row["rerun_promotable"] = second.get("state") == "booked" and res2.get("promotable") is None
                row["rerun_verdict"], row["rerun_reason"] = second.get("verdict"), second.get("reason")
                row["rerun_seconds"] = round(second["seconds"], 1)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        srv.proc.terminate()
        srv.proc.wait()
    return summarize(rows, expected)


def summarize(rows: list[dict], expected: dict[str, str]) -> int:
    rows = sorted(rows, key=lambda r: r["gate"])
    n = len(rows)
    exact = sum(r["exact"] for r in rows)
    flagged = sum(bool(r["control_flagged"]) for r in rows)
    rollbacks = sum("withdrawn_M" in r for r in rows)
    withdrew = sum(r.get("withdrawn_M") == sorted(map(int, WITHDRAWN_M)) for r in rows)
    promoted = sum(bool(r.get("rerun_promotable")) for r in rows)
    summary = {
        "gates": n, "machine": f"{platform.node()} {platform.machine()} {platform.processor() or ''}".strip(),
        "exact_bands": [exact, n, wilson(exact, n)], "control_flagged": [flagged, n, wilson(flagged, n)],
        "rollback_withdrew_exactly_the_rows_serving_c2": [withdrew, rollbacks], "rollback_promotable_on_rerun": [promoted, rollbacks],
        "effect_by_band": {b: {"mean": statistics.mean(xs), "median": statistics.median(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0,
                               "min": min(xs), "max": max(xs)}
                           for b in expected for xs in [[r["effects"][b] for r in rows if b in r["effects"]]] if xs},
        "control_by_band": {b: {"mean": statistics.mean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0}
                            for b in expected for xs in [[r["controls"][b] for r in rows if b in r["controls"]]] if xs},
        "mde_by_band": {b: statistics.mean(xs) for b in expected
                        for xs in [[r["mde"][b] for r in rows if b in r["mde"]]] if xs},
        "seconds_per_run": statistics.mean([r["seconds"] for r in rows] +
                                           [r["rerun_seconds"] for r in rows if "rerun_seconds" in r]),
    }
    summary["command"] = " ".join(sys.argv)
    print(json.dumps(summary, indent=1))
    return 0 if exact >= 0.95 * n and flagged <= 0.05 * n and withdrew == rollbacks and promoted >= 0.95 * rollbacks \
        else 1


if __name__ == "__main__":
    sys.exit(main())
