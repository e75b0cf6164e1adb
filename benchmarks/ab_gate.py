"""The serving A/B gate, repeated (issue 32): does it find exactly the planted bands, does the identical-arm
control stay quiet, does the rollback withdraw exactly the rows serving the regressing band, and is the
rolled-back version promotable on its re-run?

Everything is real processes on this machine: the service (SQLite), the driver (app/ab_driver.py, in this
process) and, per arm, the planted-effect stand-in server (tests/fixtures/ab_standin_server.py: +8% output tok/s
at concurrency >= 16 and -3% at <= 2 when its AITER_CONFIG_* files hold rows serving those batch sizes, none
between, with noise and slow drift). By default (--launch-as served) each arm is launched as the README writes it,
a shell redirect into one log, and its stand-in logs every hit at start-up (before /health, as vLLM's CUDA graph
capture does) and drifts on its own clock, so arms started apart in time drift out of step (issue 49; the driver
starts the three together, in the run's start order). The overlay and bands: tests/e2e/test_ab_gate.py (rows at M = 1, 2, 16, 64;
bands c2: -3%, c8: none, c16: +8%; the rollback of c2 withdraws M = 1, 2 and 16, whose padded bucket serves 1..2).

Each gate: a run of the version against the shipped tables; its regressing band proposes a rollback version; a
run of that version. Prints one JSON line per gate and a summary (rates with Wilson 95% intervals, the effect
estimates' spread), which goes to benchmarks/RESULTS.md.

    PYTHONPATH=. .venv/bin/python benchmarks/ab_gate.py [--gates 20] [--repeats 6] [--max-repeats 18] \
        [--target-mde 0.025]

Gates can run as parallel shards where CPUs are free (--first-gate N --gates K each, own service and seeds);
--summarize FILE... then reads their per-gate JSON lines and prints the one summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import shlex
import statistics
import sys
from collections import Counter
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.ab_driver import ONE_LOG, STALL_S, Driver, Fault  # noqa: E402
from app.domain.ab_stats import PRIMARY  # noqa: E402
from tests.conftest import DIGEST, start_server  # noqa: E402
from tests.e2e.test_ab_gate import (BANDS, GATE, MODEL, PER_RANK, RANKS, ROWS_M, STANDIN, WITHDRAWN_M,  # noqa: E402
                                    launch)
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


def served_launch(extra: str) -> str:
    """The README's launch (a shell redirect into the one log) of a stand-in that logs every hit at start-up, as
    vLLM's CUDA graph capture does, and drifts on its own clock, as a server's age does: arms started apart in time
    drift out of step."""
    return (f"{shlex.quote(sys.executable)} {shlex.quote(str(STANDIN))} --port {{port}} --ranks {RANKS} "
            f"--model {MODEL} --log-at-start --drift-clock process {extra} > {{log}} 2>&1")


def drive(url: str, run_id: int, work: Path, extra: str, stall_s: float | None, served: bool) -> dict:
    d = Driver(url, ADMIN, run_id, model=MODEL, workdir=work, launch=served_launch(extra) if served else launch(extra),
               ranks=RANKS, rank_log=ONE_LOG if served else PER_RANK, health_timeout_s=60, stall_s=stall_s)
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
            "confidence": args.confidence, "max_repeats": args.max_repeats, "target_mde": args.target_mde}
    run = c.post("/v1/ab/runs", json=body).json()
    t = time.monotonic()
    try:
        out = drive(url, run["id"], work, args.standin_args, args.stall_s or None, args.launch_as == "served")
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
    p.add_argument("--reanalyse", nargs="+", metavar="DB", help="no runs: each gate's verdicts again, with this "
                   "checkout's statistics, from the passes stored in these shards' service databases (svc.db)")
    p.add_argument("--repeats", type=int, default=GATE["repeats"])
    p.add_argument("--requests", type=int, default=GATE["requests_per_pass"])
    p.add_argument("--standin-args", default=GATE["token_ms"], help="more flags for the stand-in server")
    p.add_argument("--launch-as", choices=("served", "per-rank"), default="served", help="served: the README's "
                   "launch into one log, hits logged at start-up, drift on each server's own clock; per-rank: a log "
                   "file per rank, hits logged lazily, drift on the wall clock (the runs before issue 49)")
    p.add_argument("--confidence", type=float, default=GATE["confidence"])
    p.add_argument("--stall-s", type=float, default=STALL_S, help="the driver measures a pass again when its "
                   "event loop woke this late during it (0: never)")
    p.add_argument("--max-repeats", type=int, default=GATE["max_repeats"], help="sequential rounds: the cap")
    p.add_argument("--target-mde", type=float, default=GATE["target_mde"], help="sequential rounds: an undecided "
                   "band stops once its MDE is at most this")
    p.add_argument("--points", default=",".join(":".join(str(x[k]) for k in POINT_KEYS if k in x) for x in GATE["points"]),
                   help="the bands, CONCURRENCY:INPUT_LEN:OUTPUT_LEN[:REQUESTS_PER_PASS],... (concurrencies 2, 8, "
                        "16: the planted ones)")
    args = p.parse_args()
    args.points = [dict(zip(POINT_KEYS, map(int, x.split(":")))) for x in args.points.split(",")]
    expected = {f"c{x['concurrency']}-i{x['input_len']}-o{x['output_len']}": v
                for x, v in zip(args.points, BANDS.values())}
    if args.reanalyse:
        rows = [row for db in args.reanalyse for row in reanalyse(Path(db), expected)]
        for row in rows:
            print(json.dumps(row), flush=True)
        return summarize(rows, expected)
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
            row = {"gate": g, "start_order": first.get("start_order"), "verdict": first.get("verdict"),
                   "reason": first.get("reason"), "bands": got,
                   "exact": got == expected and first.get("verdict") != "void", "control_flagged": res.get("control_flagged", []),
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
            row["probe"] = probe_figures(tmp / "svc.db", [first["id"]] + ([second["id"]] if rb_id else []))
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        srv.proc.terminate()
        srv.proc.wait()
    return summarize(rows, expected)


def probe_figures(db: Path, run_ids: list[int]) -> dict:
    """The driver's node probe over these runs' posted passes: how many, how many were measured again because the
    node stalled (and the tries discarded), how many were posted stalled (every try was), the largest lag."""
    import sqlite3

    with sqlite3.connect(db) as con:
        probes = [json.loads(x) for (x,) in con.execute(
            f"SELECT probe FROM ab_passes WHERE run_id IN ({','.join('?' * len(run_ids))}) AND probe IS NOT NULL",
            run_ids)]
    return {"passes": len(probes), "remeasured": sum(p.get("stalled_passes", 0) > 0 for p in probes),
            "tries_discarded": sum(p.get("stalled_passes", 0) for p in probes),
            "posted_over_stall_s": sum(p["lag_max_s"] > STALL_S for p in probes),
            "lag_max_s": max((p["lag_max_s"] for p in probes), default=None)}


def reanalyse(db: Path, expected: dict[str, str]) -> list[dict]:
    """Per gate, the rows `main` prints, from a shard's database: every booked run assessed again
    (app.services.ab.assess: what booking computes, nothing written). The rollback is the one the live booking
    proposed, and a re-run exists where the live gate found a regression; a gate cut short is left out."""
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from app.db.models import AbRun, OverlayVersion
    from app.services import ab

    out: dict[int, dict] = {}
    from app.db import migrate
    migrate.upgrade(f"sqlite:///{db}")  # a shard's database from an older checkout: this one's columns
    with Session(create_engine(f"sqlite:///{db}")) as s:
        for r in s.scalars(select(AbRun).order_by(AbRun.id)):
            if r.state != "booked":
                continue
            res = ab.assess(s, r)[0]
            secs = round((r.updated_at - r.created_at).total_seconds(), 1)
            got = {b["band"]: b["verdict"] for b in res["bands"]}
            if r.seed < 5000:
                row = out[r.seed - 1000] = {
                    "gate": r.seed - 1000, "db": str(db), "run_id": r.id, "verdict": res["verdict"],
                    "reason": res["reason"], "bands": got, "exact": got == expected and res["verdict"] != "void",
                    "control_flagged": res["control_flagged"], **band_figures(res), "seconds": secs}
                if r.rollback_version_id:
                    rb = s.get(OverlayVersion, r.rollback_version_id)
                    row["withdrawn_M"] = sorted(int(w["row"]["M"]) for w in (rb.withdrawn or []))
            else:
                row = out[r.seed - 5000]
                row["rerun_bands"], row["rerun_verdict"], row["rerun_reason"] = got, res["verdict"], res["reason"]
                row["rerun"] = band_figures(res) | {"control_flagged": res["control_flagged"]}
                row["rerun_promotable_reason"] = res["promotable"]
                row["rerun_promotable"] = res["promotable"] is None
                row["rerun_seconds"] = secs
    # a gate is whole once its rollback (if the live booking proposed one) has been re-run and booked
    return [out[g] for g in sorted(out) if "withdrawn_M" not in out[g] or "rerun" in out[g]]


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "mean": statistics.mean(xs),
            "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0}


def _by_band(rows: list[dict], key: str, bands: list[str]) -> dict[str, dict[str, float]]:
    return {b: _spread(xs) for b in bands for xs in [[r[key][b] for r in rows if b in r.get(key, {})]] if xs}


def _by_start_order(rows: list[dict], bands: list[str]) -> dict:
    """Per start order and band with nothing planted: the mean effect of B and of the control A' (vs A). With A
    started between them, what start order does to B it does to the control with the opposite sign."""
    out: dict[str, dict] = {}
    for order in sorted({",".join(r["start_order"]) for r in rows if r.get("start_order")}):
        these = [r for r in rows if ",".join(r.get("start_order") or []) == order]
        out[order] = {}
        for b in bands:
            eff = [r["effects"][b] for r in these if r.get("effects", {}).get(b) is not None]
            ctl = [r["controls"][b] for r in these if r.get("controls", {}).get(b) is not None]
            if eff and ctl:
                out[order][b] = {"gates": len(these), "B": statistics.mean(eff), "control": statistics.mean(ctl)}
    return out


def summarize(rows: list[dict], expected: dict[str, str]) -> int:
    """The figures RESULTS.md reports: rates with Wilson 95% intervals, verdict counts per band, the effect and
    MDE spread per band (B vs A, the control A' vs A, and the re-runs of the rollback)."""
    rows = sorted(rows, key=lambda r: r["gate"])
    n, bands = len(rows), list(expected)
    exact = sum(r["exact"] for r in rows)
    flagged = sum(bool(r["control_flagged"]) for r in rows)
    rb = [r for r in rows if "withdrawn_M" in r]
    withdrew = sum(r["withdrawn_M"] == sorted(map(int, WITHDRAWN_M)) for r in rb)
    promoted = sum(bool(r.get("rerun_promotable")) for r in rb)
    sign = {"gain": 1, "regression": -1, "neutral": 0}
    wrong = sum(1 for r in rows for b in bands if sign.get(r["bands"].get(b, ""), 0) * sign[expected[b]] < 0
                or (expected[b] == "neutral" and r["bands"].get(b) in ("gain", "regression")))
    reruns = [r["rerun"] for r in rb if "rerun" in r]
    summary = {
        "gates": n, "machine": f"{platform.node()} {platform.machine()} {platform.processor() or ''}".strip(),
        "exact_bands": [exact, n, wilson(exact, n)], "control_flagged": [flagged, n, wilson(flagged, n)],
        "verdicts_by_band": {b: dict(Counter(r["bands"].get(b, "-") for r in rows)) for b in bands},
        "wrong_way_band_verdicts": [wrong, n * len(bands)],
        "rollback_withdrew_exactly_the_rows_serving_c2": [withdrew, len(rb)],
        "rollback_promotable_on_rerun": [promoted, len(rb), wilson(promoted, len(rb))],
        "rerun_not_promotable_because": [r.get("rerun_promotable_reason") for r in rb if not r.get("rerun_promotable")],
        "rerun_verdicts_by_band": {b: dict(Counter(r.get("rerun_bands", {}).get(b, "-") for r in rb)) for b in bands},
        "effect_by_band": _by_band(rows, "effects", bands), "control_by_band": _by_band(rows, "controls", bands),
        "mde_by_band": _by_band(rows, "mde", bands), "output_tok_s_effect_by_band": _by_band(rows, "output_tok_s", bands),
        "rounds_by_band": _by_band(rows, "rounds", bands), "rerun_rounds_by_band": _by_band(reruns, "rounds", bands),
        "probe": {k: sum(r.get("probe", {}).get(k) or 0 for r in rows) for k in ("passes", "remeasured",
                                                                                 "tries_discarded", "posted_over_stall_s")},
        "rerun_effect_by_band": _by_band(reruns, "effects", bands), "rerun_mde_by_band": _by_band(reruns, "mde", bands),
        "seconds_per_run": statistics.mean([r["seconds"] for r in rows] + [r["rerun_seconds"] for r in rb
                                                                           if "rerun_seconds" in r]),
        "neutral_band_by_start_order": _by_start_order(rows, [b for b in bands if expected[b] == "neutral"]),
        "command": " ".join(sys.argv)}
    print(json.dumps(summary, indent=1))
    ok = exact >= 0.95 * n and flagged <= 0.05 * n and withdrew == len(rb) and promoted >= 0.95 * len(rb)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
