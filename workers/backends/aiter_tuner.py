"""Backend `aiter`: run the image's own AITER tuner script on a leased batch and read its tuned CSV back.

Command lines follow aiter/utility/base_tuner.py (-i/-o/--mp/--batch/--timeout; `--batch 1` makes the
tuner write its output after every shape). `-o` is always given (with --preshuffle the default output is the
wrong file; and base_tuner.run() asserts a non-empty -o even for --run_config, base_tuner.py:321-325, 1377).
Tuners exit 1 when any shape failed; shapes with no row in the output are reported failed with the tuner's
last output lines.

The race is two-phase by default (`two_phase`): a cheap screening run (--warmup/--iters well under AITER's
5/101, base_tuner.py:51-52) with -o2/--profile_file, which keeps every candidate's time (post_process,
base_tuner.py:479-491); then per shape the finalists (the best few and every candidate inside the leader's band)
are confirmed through the production op with --run_config, one tuned CSV per rank (run() keeps one row per
key, base_tuner.py:1372), plus one bare --run_config for the default path the image takes today. The winner is
the fastest confirmed finalist by AITER's end-to-end time; a row is posted only when it beats the default by
--min_improvement_pct (3%), the rule of --compare --update_improved; otherwise the shape is "default is best".
Both phases stay inside the lease budget: the screen gets `screen_share` of it, each --run_config the rest.
A shape carried over an image upgrade (lease `incumbent`/`finalists`, issue 24) also confirms those kernels
through --run_config, and its incumbent keeps a gain under `incumbent_tie`; the screen still runs, since the
lease names kernels, not the tuned rows --run_config replays (`with_carried`).
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.domain.families import FAMILIES, TableFamily, get_family
from app.domain.keys import row_key
from app.domain.tables import Table, read_table, render_csv
from app.wire import ResultStatus
from workers.backends.base import Batch, Emit, GpuBusy, ShapeResult, now_iso, row_helps

# the families whose AITER tuner this backend can race (TableFamily.tuner_script, tuner_races)
TUNABLE = [f.name for f in FAMILIES.values() if f.tuner_script and f.tuner_races]
DEFAULT_PATH = "aiter_default_path"  # the candidate the bare --run_config timed: what the image runs with no row


def default_aiter_root() -> Path | None:
    env = os.environ.get("AITER_ROOT")
    if env:
        return Path(env)
    try:
        import importlib.util
        spec = importlib.util.find_spec("aiter")
    except (ImportError, ValueError):
        return None
    if not spec or not spec.origin:
        return None
    site = Path(spec.origin).resolve().parents[1]
    # a wheel install ships the tuner scripts under aiter_meta/csrc; a source checkout has csrc/ at its root
    return site / "aiter_meta" if (site / "aiter_meta" / "csrc").is_dir() else site


def tuner_command(family: TableFamily, root: Path, untuned: Path, tuned: Path, timeout_s: int, mp: int = 1,
                  python: str = sys.executable, extra: tuple[str, ...] = ()) -> list[str]:
    if family.tuner_script is None:
        raise ValueError(f"{family.name} has no AITER tuner")
    return [python, str(root / family.tuner_script), "-i", str(untuned), "-o", str(tuned), *family.tuner_args,
            "--mp", str(mp), "--batch", "1", "--timeout", str(max(1, timeout_s)), *extra]


def run_config_command(family: TableFamily, root: Path, tuned_csv: Path | None, untuned: Path,
                       python: str = sys.executable, scratch: Path | None = None) -> list[str]:
    """AITER's own replay of tuned rows through the production op (sets AITER_REBUILD=2 itself); with no
    tuned_csv, the production op on the image's own tables (the default path). `-o scratch` keeps the tuner's
    pre_process from dropping shapes its default tuned file already holds (GemmCommonTuner.pre_process)."""
    if family.tuner_script is None:
        raise ValueError(f"{family.name} has no AITER tuner")
    out = ["-o", str(scratch)] if scratch is not None else []
    cfg = [str(tuned_csv)] if tuned_csv is not None else []
    return [python, str(root / family.tuner_script), "-i", str(untuned), *out, *family.tuner_args,
            "--run_config", *cfg]


def untuned_csv(family: TableFamily, shapes: list[dict[str, Any]], header: tuple[str, ...] | None = None) -> str:
    header = header or family.untuned_header
    return render_csv(header, [s["shape"] for s in shapes])


def _err(family: TableFamily, row: dict[str, str]) -> float | None:
    vals = []
    for col in family.err_columns:
        raw = (row.get(col) or "").strip()
        if not raw or raw == "Null":
            continue
        vals.append(float(raw.rstrip("%")) / 100 if raw.endswith("%") else float(raw))
    return max(vals) if vals else (0.0 if not family.err_columns else None)


def _us(row: dict[str, str]) -> float | None:
    try:
        return float(row.get("us", ""))
    except ValueError:
        return None


def match_rows(family: TableFamily, lease: dict[str, Any], table: Table) -> dict[int, dict[str, str]]:
    """shape_id -> the tuner's row for it (the tuner stamps rows with the live gfx and cu_num)."""
    keys = tuple(c for c in family.key_columns if c in table.header)
    by_key = {row_key(keys, r): r for r in table.rows}
    out = {}
    for item in lease["shapes"]:
        want = dict(item["shape"], gfx=lease["gfx"], cu_num=str(lease["cu_num"]))
        row = by_key.get(row_key(keys, want))
        if row is not None:
            out[item["shape_id"]] = row
    return out


def result_from_row(family: TableFamily, lease: dict[str, Any], shape_id: int, row: dict[str, str],
                    elapsed_s: float, started: str) -> ShapeResult:
    us, err = _us(row), _err(family, row)
    kernel = row.get("kernelName") or "+".join(x for x in (row.get("kernelName1"), row.get("kernelName2")) if x)
    header = lease.get("tuned_header") or list(family.tuned_header)
    out_row = {c: row.get(c, "") for c in header}
    return ShapeResult(shape_id, ResultStatus.OK, row=out_row, us=us, err_ratio=err, kernel_name=kernel or None,
                       elapsed_s=elapsed_s, started_at=started, finished_at=now_iso())


_BENCH_LINE = re.compile(r"^(?P<shape>.*?)\s+\|\s+(?:(?P<kernel>\S+)\s+\|\s+)?(?P<e2e>\S+)\s+\|\s+(?P<status>\S+)\s*$")


def _num(cell: str | None) -> float | None:
    try:
        v = float(cell) if cell not in (None, "N/A") else None
    except ValueError:
        return None
    return v if v is not None and math.isfinite(v) and v > 0 else None


def parse_benchmark(lines: list[str], family: TableFamily, lease: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """shape_id -> {kernel_us, e2e_us, status} from the table TunerCommon._print_benchmark_results prints
    (base_tuner.py:741-815): a "shape | [kernel us |] e2e us | status" line, then "keys: k=v, ..."."""
    keys = tuple(c for c in family.key_columns)
    want = {row_key(keys, dict(item["shape"], gfx=lease["gfx"], cu_num=str(lease["cu_num"]))): item["shape_id"]
            for item in lease["shapes"]}
    out: dict[int, dict[str, Any]] = {}
    last: dict[str, Any] | None = None
    for line in lines:
        if line.startswith("keys: "):
            cells = dict(part.split("=", 1) for part in line[len("keys: "):].split(", ") if "=" in part)
            sid = want.get(row_key(keys, cells))
            if sid is not None and last is not None:
                out[sid] = last
            last = None
            continue
        m = _BENCH_LINE.match(line)
        if m and m.group("status") not in ("Status",) and not line.startswith("-"):
            last = {"kernel_us": _num(m.group("kernel")), "e2e_us": _num(m.group("e2e")),
                    "status": m.group("status")}
    return out


def finalists(rows: list[dict[str, str]], top_k: int, band: float, cap: int) -> list[dict[str, str]]:
    """The screening's best `top_k`, and every candidate inside the leader's band, at most `cap`."""
    if not rows:
        return []
    lead = _us(rows[0]) or math.inf
    return [r for i, r in enumerate(rows) if i < top_k or (_us(r) or math.inf) <= lead * (1 + band)][:cap]


def _kernel(row: dict[str, str]) -> str | None:
    return row.get("kernelName") or row.get("kernelId")


def with_carried(fin: list[dict[str, str]], rows: list[dict[str, str]], names: list[str] | None
                 ) -> list[dict[str, str]]:
    """A shape carried over an image upgrade (issue 24) also confirms its incumbent and the old race's
    finalists through --run_config, using their rows from this image's screen (the lease names kernels, not
    rows: --run_config needs the tuned row's kernelId/splitK, so the screen cannot be skipped). A name the
    screen did not pass (gone from the image, or wrong) has no row and is not confirmed."""
    have = {_kernel(r) for r in fin}
    extra = [r for r in rows if _kernel(r) in set(names or ()) - have]
    return fin + list({_kernel(r): r for r in extra}.values())


def _module(path: Path) -> Any:
    """A module of AITER's csrc by its file (the tuner scripts import it as a top-level module of their folder)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"aiter_catalog_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


Confirmed = list[tuple[dict[str, str], dict[str, Any]]]  # one shape's confirmed finalists: (its row, its bench)


@dataclass
class _Race:
    """A two-phase race's state, phase by phase: the screen's exit code, last output lines and ranked
    candidates per shape; the default path's and the finalists' --run_config benchmarks per shape."""

    started: str  # ISO time the race began (every result's started_at)
    t0: float  # time.monotonic() then
    profile: Path  # the screen's -o2: every candidate's time (base_tuner.py post_process)
    rc: int | None = None
    tail: list[str] = field(default_factory=list)
    ranked: dict[int, list[dict[str, str]]] = field(default_factory=dict)
    default: dict[int, dict[str, Any]] = field(default_factory=dict)
    confirmed: dict[int, Confirmed] = field(default_factory=dict)


class AiterBackend:
    name = "aiter"
    families = TUNABLE

    def __init__(self, root: Path | None = None, mp: int = 1, python: str = sys.executable, poll_s: float = 1.0,
                 margin_s: float = 5.0, extra: tuple[str, ...] = (), two_phase: bool = True,
                 screen_warmup: int = 2, screen_iters: int = 10, screen_share: float = 0.6, top_k: int = 2,
                 band: float = 0.05, max_finalists: int = 4, err_max: float = 0.05,
                 min_improvement_pct: float = 3.0, incumbent_tie: float = 0.01, replay: bool = False,
                 device: str = "cuda:0", llc_bytes: int | None = None):
        self.root = root or default_aiter_root()
        self.mp, self.python, self.poll_s, self.margin_s, self.extra = mp, python, poll_s, margin_s, extra
        self.two_phase, self.screen_warmup, self.screen_iters = two_phase, screen_warmup, screen_iters
        self.screen_share, self.top_k, self.band, self.max_finalists = screen_share, top_k, band, max_finalists
        self.err_max, self.min_improvement_pct = err_max, min_improvement_pct
        self.incumbent_tie = incumbent_tie  # a confirmed incumbent keeps a gain under this (the torch tie floor)
        # issue 34: the confirmed finalists and the default timed again by aiter_replay.py (CUDA-graph capture
        # windows, guard, negative controls, SNR gate, capture-aware decision) where the family has a ReplaySpec
        self.replay, self.device, self.llc_bytes = replay, device, llc_bytes

    def run(self, batch: Batch, emit: Emit) -> None:
        if self.root is None:
            raise RuntimeError("aiter backend: AITER not found (set AITER_ROOT or install aiter)")
        family = get_family(batch.lease["family"])
        with tempfile.TemporaryDirectory(prefix="aiter-lease-") as tmp:
            untuned, tuned = Path(tmp, family.untuned_file), Path(tmp, family.tuned_file)
            header = tuple(batch.lease.get("untuned_header") or family.untuned_header)  # the image's own
            untuned.write_text(untuned_csv(family, batch.lease["shapes"], header))
            if self.two_phase:
                self._two_phase(batch, family, Path(tmp), untuned, tuned, emit)
                return
            timeout = int(batch.time_left() - self.margin_s)
            cmd = tuner_command(family, self.root, untuned, tuned, timeout, self.mp, self.python, self.extra)
            self._drive(batch, family, cmd, tuned, emit, cwd=self.root)

    def kernel_catalog(self) -> dict[str, list[str]]:
        """The image's own kernel lists (TableFamily.catalog_lists), read from its AITER: per family whose every
        candidate list is known, the names its tuner may race and write as kernelName. A list that cannot be
        read leaves its family out (no catalog: nothing refused, nothing known gone)."""
        out: dict[str, list[str]] = {}
        if self.root is None:
            return out
        for name in self.families:
            fam = get_family(name)
            if not fam.catalog_lists:
                continue
            try:
                out[name] = sorted({k.name for path, attr in fam.catalog_lists
                                    for k in getattr(_module(self.root / path), attr).values()})
            except Exception as e:  # noqa: BLE001 - an image whose lists moved: reported as unknown
                print(f"aiter backend: no kernel catalog for {name}: {type(e).__name__}: {e}", file=sys.stderr)
        return out

    def warm(self, lease: dict[str, Any], budget_s: float, should_stop: Any = lambda: False) -> dict[str, Any]:
        """The compile lane: run the tuner once on the lease's first shape with one warm-up and one iteration,
        so AITER's JIT builds (and caches) every module the family's tuner and its op need, under this budget
        alone. Returns the wire's build report fields."""
        if self.root is None:
            return {"seconds": 0.0, "ok": False, "output_tail": "AITER not found"}
        family = get_family(lease["family"])
        with tempfile.TemporaryDirectory(prefix="aiter-build-") as tmp:
            one = Path(tmp, family.untuned_file)
            header = tuple(lease.get("untuned_header") or family.untuned_header)
            one.write_text(untuned_csv(family, lease["shapes"][:1], header))
            cmd = tuner_command(family, self.root, one, Path(tmp, family.tuned_file), int(budget_s), 1, self.python,
                                ("--warmup", "1", "--iters", "1", *self.extra))
            t0 = time.monotonic()
            batch = Batch(lease, t0 + budget_s, should_stop)
            rc, lines, how = self._run(cmd, batch, t0 + budget_s)
            tail = "\n".join(lines[-60:])[-20_000:]
            return {"seconds": time.monotonic() - t0, "ok": how == "done" and rc == 0, "output_tail": tail}

    # -- two phases: screen every candidate cheaply, confirm the finalists through the production op ----------

    def _two_phase(self, batch: Batch, family: TableFamily, tmp: Path, untuned: Path, tuned: Path,
                   emit: Emit) -> None:
        race = _Race(now_iso(), time.monotonic(), tmp / "profile.csv")
        if not self._screen(batch, family, untuned, tuned, race):
            return  # abandoned: the agent releases the rest
        carried = {item["shape_id"]: [n for n in (item.get("incumbent"), *(item.get("finalists") or [])) if n]
                   for item in batch.lease["shapes"]}
        fin = {sid: with_carried(finalists(rows, self.top_k, self.band, self.max_finalists), rows, carried.get(sid))
               for sid, rows in race.ranked.items()}
        if fin and batch.time_left() > self.margin_s and not self._confirm(batch, family, tmp, untuned, fin, race):
            return
        screen = match_rows(family, batch.lease, read_table(tuned.read_text(), str(tuned))) if tuned.exists() else {}
        replayed = (self._replayed(batch, family, tmp, race.confirmed)
                    if self.replay and family.replay and race.confirmed else {})
        for item in batch.lease["shapes"]:
            emit(self._verdict(family, batch.lease, item, race, screen.get(item["shape_id"]), replayed))

    def _screen(self, batch: Batch, family: TableFamily, untuned: Path, tuned: Path, race: _Race) -> bool:
        """Phase 1: every candidate timed cheaply (-o2 keeps each one's time); False when stopped."""
        assert self.root is not None
        screen_s = max(1.0, (batch.time_left() - self.margin_s) * self.screen_share)
        cmd = tuner_command(family, self.root, untuned, tuned, int(screen_s), self.mp, self.python,
                            ("--warmup", str(self.screen_warmup), "--iters", str(self.screen_iters),
                             "-o2", str(race.profile), *self.extra))
        race.rc, lines, how = self._run(cmd, batch, time.monotonic() + screen_s)
        if how == "stop":
            return False
        race.tail = lines[-40:]
        race.ranked = self._screened(family, batch.lease, race.profile)
        return True

    def _confirm(self, batch: Batch, family: TableFamily, tmp: Path, untuned: Path,
                 fin: dict[int, list[dict[str, str]]], race: _Race) -> bool:
        """Phase 2: the default path, then the finalists rank by rank (one tuned CSV each), through the
        production op with --run_config, while the budget lasts; False when stopped."""
        assert self.root is not None
        scratch = tmp / "scratch_tuned.csv"  # -o for --run_config: nothing skipped, nothing of the image touched
        _, out_d, how = self._run(run_config_command(family, self.root, None, untuned, self.python, scratch),
                                  batch, batch.deadline - self.margin_s / 2)
        if how == "stop":
            return False
        race.default = parse_benchmark(out_d, family, batch.lease)
        header = read_table(race.profile.read_text(), str(race.profile)).header
        for r in range(max(len(f) for f in fin.values())):
            rank = {sid: f[r] for sid, f in fin.items() if len(f) > r}
            if not rank or batch.time_left() <= self.margin_s:
                break
            rank_csv = tmp / f"rank{r + 1}.csv"
            rank_csv.write_text(render_csv(header, list(rank.values())))
            _, out_r, how = self._run(run_config_command(family, self.root, rank_csv, untuned, self.python,
                                                         scratch), batch, batch.deadline - self.margin_s / 2)
            if how == "stop":
                return False
            for sid, bench in parse_benchmark(out_r, family, batch.lease).items():
                if sid in rank and bench["status"] == "OK" and bench["e2e_us"]:
                    race.confirmed.setdefault(sid, []).append((rank[sid], bench))
        return True

    def _verdict(self, family: TableFamily, lease: dict[str, Any], item: dict[str, Any], race: _Race,
                 screened: dict[str, str] | None, replayed: dict[int, dict[str, Any]]) -> ShapeResult:
        """Phase 3, one shape: the fastest confirmed finalist against the default; else the screen's winner with
        no baseline; else failed. The replay's decision, where it ran, replaces AITER's timing."""
        sid = item["shape_id"]
        cands = [{"name": r.get("kernelName") or r.get("kernelId"), "us": _us(r), "err_ratio": _err(family, r)}
                 for r in race.ranked.get(sid, [])]
        elapsed = time.monotonic() - race.t0
        if race.confirmed.get(sid):
            res = self._confirmed(family, lease, item, race, cands, elapsed)
        elif screened is not None:  # no confirmation inside the budget: the screening winner, no baseline
            res = result_from_row(family, lease, sid, screened, elapsed, race.started)
        else:
            why = f"AITER tuner exit {race.rc}; no row for this shape. Last output:\n" + "\n".join(race.tail)
            res = ShapeResult(sid, ResultStatus.FAILED, error=why[-4000:], elapsed_s=elapsed,
                              started_at=race.started, finished_at=now_iso())
        res.candidates = cands[:10_000]
        res.race = {"confirmed": [_kernel(r) for r, _ in race.confirmed.get(sid, [])]}
        if sid in replayed and res.status != ResultStatus.FAILED:
            self._replay_verdict(family, lease, res, race.confirmed[sid], replayed[sid], elapsed, race.started)
        return res

    def _confirmed(self, family: TableFamily, lease: dict[str, Any], item: dict[str, Any], race: _Race,
                   cands: list[dict[str, Any]], elapsed: float) -> ShapeResult:
        """The fastest confirmed finalist by AITER's end-to-end time (a carried incumbent keeps a gain under the
        tie floor), a row only where it beats the default by min_improvement_pct; the default joins cands."""
        sid, confirmed = item["shape_id"], race.confirmed[item["shape_id"]]
        row, bench = min(confirmed, key=lambda x: x[1]["e2e_us"])
        inc = next((x for x in confirmed if _kernel(x[0]) == item.get("incumbent")), None)
        if inc is not None and bench["e2e_us"] >= inc[1]["e2e_us"] * (1 - self.incumbent_tie):
            row, bench = inc  # a gain inside the tie floor does not overturn a carried row
        d = race.default.get(sid) or {}
        res = result_from_row(family, lease, sid, row, elapsed, race.started)
        res.us, res.default_us = bench["e2e_us"], d.get("e2e_us")  # AITER's --compare compares e2e
        if res.default_us is not None:  # the default timed in this race: one of its candidates
            cands.append({"name": DEFAULT_PATH, "us": res.default_us, "err_ratio": None})
        if not row_helps(res.us, res.default_us, self.min_improvement_pct):
            res.status, res.row = ResultStatus.DEFAULT_BEST, None
        return res

    def _replayed(self, batch: Batch, family: TableFamily, tmp: Path,
                  confirmed: dict[int, list[tuple[dict[str, str], dict[str, Any]]]]) -> dict[int, dict[str, Any]]:
        """Run aiter_replay.py in the image's Python over the confirmed finalists: shape_id -> its record. A busy
        GPU hands the lease back (GpuBusy); a replay that fails leaves AITER's own confirmation standing."""
        import json
        by_sid = {x["shape_id"]: x for x in batch.lease["shapes"]}
        shapes = [{"shape_id": sid, "cells": by_sid[sid]["shape"], "incumbent": by_sid[sid].get("incumbent"),
                   "finalists": [{"name": _kernel(r), "kernelId": r.get("kernelId"), "splitK": r.get("splitK") or 0}
                                 for r, _ in rows if r.get("kernelId") not in (None, "")]}
                  for sid, rows in confirmed.items()]
        job, out = tmp / "replay_job.json", tmp / "replay_out.json"
        job.write_text(json.dumps({"root": str(self.root), "family": family.name, "device": self.device,
                                   "llc_bytes": self.llc_bytes, "shapes": shapes}))
        cmd = [self.python, "-m", "workers.backends.aiter_replay", str(job), str(out)]
        rc, lines, how = self._run(cmd, batch, batch.deadline - self.margin_s / 2)
        if how != "done" or rc != 0 or not out.exists():
            return {sid: {"error": f"replay did not finish ({how}, exit {rc}): " + "\n".join(lines[-20:])[-2000:]}
                    for sid in confirmed}
        got = {r["shape_id"]: r for r in json.loads(out.read_text())}
        busy = [r["busy"] for r in got.values() if r.get("busy")]
        if busy:
            raise GpuBusy(busy[0])
        return got

    def _replay_verdict(self, family: TableFamily, lease: dict[str, Any], res: ShapeResult,
                        rows: list[tuple[dict[str, str], dict[str, Any]]], rec: dict[str, Any], elapsed: float,
                        started: str) -> None:
        """The replay's decision replaces AITER's profiler timing: its winner's row (or the default), its times,
        confidence, spread and decision; its candidates (worst, p90, drift, each capture window) beside the
        screen's."""
        res.race = dict(res.race or {}, replay=rec.get("error") or rec.get("timing"))
        if rec.get("error") or not rec.get("winner"):
            return  # AITER's own confirmation stands; the replay's failure is recorded
        res.candidates = [*rec["candidates"], *res.candidates][:10_000]
        res.confidence, res.spread, res.timing = rec.get("confidence"), rec.get("spread"), rec.get("timing")
        res.default_us = rec.get("default_us")
        row = next((r for r, _ in rows if _kernel(r) == rec["winner"]), None)
        if row is None or not row_helps(rec["us"], res.default_us, self.min_improvement_pct):
            res.status, res.row, res.us = ResultStatus.DEFAULT_BEST, None, rec["us"]
            res.kernel_name = rec["winner"]
            return
        won = result_from_row(family, lease, res.shape_id, row, elapsed, started)
        res.status, res.row, res.kernel_name, res.err_ratio = won.status, won.row, won.kernel_name, won.err_ratio
        res.us = rec["us"]

    def _screened(self, family: TableFamily, lease: dict[str, Any], profile: Path) -> dict[int, list[dict[str, str]]]:
        """shape_id -> its valid screened candidates (time measured, error inside AITER's errRatio), fastest first."""
        if not profile.exists():
            return {}
        table = read_table(profile.read_text(), str(profile))
        keys = tuple(c for c in family.key_columns if c in table.header)
        want = {row_key(keys, dict(item["shape"], gfx=lease["gfx"], cu_num=str(lease["cu_num"]))): item["shape_id"]
                for item in lease["shapes"]}
        out: dict[int, list[dict[str, str]]] = {}
        for row in table.rows:
            sid = want.get(row_key(keys, row))
            us, err = _us(row), _err(family, row)
            if sid is not None and us is not None and us > 0 and math.isfinite(us) and err is not None \
                    and err <= self.err_max:
                out.setdefault(sid, []).append(row)
        return {sid: sorted(rows, key=lambda r: _us(r) or math.inf) for sid, rows in out.items()}

    def _run(self, cmd: list[str], batch: Batch, until: float) -> tuple[int | None, list[str], str]:
        """Run one tuner process to its end, to `until`, or to a stop: (exit code, output lines, how)."""
        lines: deque[str] = deque(maxlen=200_000)
        proc = subprocess.Popen(cmd, cwd=self.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        reader = _pump(proc, lines)
        while proc.poll() is None:
            if batch.should_stop() or time.monotonic() >= until:
                _kill(proc)
                return proc.returncode, list(lines), "stop" if batch.should_stop() else "budget"
            time.sleep(self.poll_s)
        reader.join(timeout=10)  # the last lines
        return proc.returncode, list(lines), "done"

    def _drive(self, batch: Batch, family: TableFamily, cmd: list[str], tuned: Path, emit: Emit, cwd: Path) -> None:
        started, t0 = now_iso(), time.monotonic()
        tail: deque[str] = deque(maxlen=40)
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        _pump(proc, tail)
        posted: set[int] = set()
        last_t = t0
        while True:
            done = proc.poll() is not None
            if tuned.exists():
                for sid, row in match_rows(family, batch.lease, read_table(tuned.read_text(), str(tuned))).items():
                    if sid not in posted:
                        now = time.monotonic()
                        emit(result_from_row(family, batch.lease, sid, row, now - last_t, started))
                        posted.add(sid)
                        last_t = now
            if done:
                break
            if batch.should_stop() or batch.time_left() <= self.margin_s / 2:
                _kill(proc)
                if batch.should_stop():
                    return  # abandoned: the agent releases the rest
                tail.append("[agent] tuner stopped at the lease budget")
                break
            time.sleep(self.poll_s)
        why = f"AITER tuner exit {proc.returncode}; no row for this shape. Last output:\n" + "\n".join(tail)
        for item in batch.lease["shapes"]:
            if item["shape_id"] not in posted:
                emit(ShapeResult(item["shape_id"], ResultStatus.FAILED, error=why[-4000:], elapsed_s=time.monotonic() - last_t,
                                 started_at=started, finished_at=now_iso()))


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _pump(proc: subprocess.Popen, tail: deque[str]) -> threading.Thread:
    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t
