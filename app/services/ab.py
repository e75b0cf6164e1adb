"""The serving A/B (issue 32): overlay versions, runs, their passes, verdicts, promotion and rollback.

Each use case is one transaction (the route's session): a pass is stored whole or not at all, a run is booked
with all its verdicts at once, a promotion moves both versions at once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.ab_wire import ARMS, Answer, OperatingPoint, RequestRecord
from app.db.models import AbArm, AbPass, AbRun, Campaign, Image, OverlayVersion
from app.domain import ab_gate, ab_stats, served
from app.domain import ab_states as st
from app.domain.deploy import UNKNOWN_CONFIGS
from app.domain.families import get_family
from app.domain.lease_states import TransitionError
from app.domain.tables import Table, read_table, render_csv
from app.errors import Conflict, Invalid, NotFound
from app.services import overlays

OVERLAY_MARK = "@overlay"  # in a version file's env paths: where the driver puts the downloaded file


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _now() -> datetime:
    return datetime.now(timezone.utc)


# ---- versions ---------------------------------------------------------------------------------------------------

def version_dict(v: OverlayVersion, content: bool = False) -> dict[str, Any]:
    files = [{k: f[k] for k in ("family", "env_var", "name", "sha256", "rows", "paths")} |
             ({"content": f["content"]} if content else {}) for f in v.files]
    return {"id": v.id, "image_digest": v.image_digest, "form": v.form, "state": v.state, "files": files,
            "parent_id": v.parent_id, "note": v.note, "withdrawn": v.withdrawn,
            "promoted_at": v.promoted_at.isoformat() if v.promoted_at else None,
            "promoted_run_id": v.promoted_run_id, "created_at": v.created_at.isoformat() if v.created_at else None}


def _file(family: str, env_var: str, name: str, content: str, own: str, paths: list[str]) -> dict[str, Any]:
    rows = len(read_table(content).rows) if content.strip() else 0
    return {"family": family, "env_var": env_var, "name": name, "sha256": _sha(content), "rows": rows,
            "content": content, "own": own, "paths": paths}


def _same_version(s: Session, digest: str, form: str, files: list[dict]) -> OverlayVersion | None:
    want = sorted((f["family"], f["sha256"]) for f in files)
    for v in s.scalars(select(OverlayVersion).where(OverlayVersion.image_digest == digest,
                                                    OverlayVersion.form == form)):
        if sorted((f["family"], f["sha256"]) for f in v.files) == want:
            return v
    return None


def make_version(s: Session, digest: str, form: str, families: list[str] | None) -> tuple[dict, bool]:
    """The image's overlays as deployed in `form`, frozen: one file per family with rows. The same files make
    the same version (returned, not made again)."""
    if s.get(Image, digest) is None:
        raise NotFound("image_digest: no such image", "image_digest")
    fams = families or sorted(set(s.scalars(select(Campaign.family).where(Campaign.image_digest == digest))))
    files = []
    for name in fams:
        ov = overlays.deployable(s, digest, name, form=form)
        if not ov.table.rows:
            continue
        base = overlays.build(s, digest, name)
        plan = overlays.deploy_plan(s, digest, name)
        if form == "layer":
            if not plan["layer"]["offered"]:  # e.g. the image's tables unknown: the value would replace them
                raise Conflict(f"{name}: the layer form is not offered: {plan['layer']['why_not']}", "form")
            if any(p.startswith(UNKNOWN_CONFIGS) for p in plan["layer"]["files"]):
                # AITER skips a path that does not exist: the server would load the overlay without the shipped rows
                raise Conflict(f"{name}: the image's configs folder is unknown (its worker reported the tables "
                               f"without configs_dir), so the layer's value would name {UNKNOWN_CONFIGS}/..., a "
                               "path no server can open: report the tables with configs_dir, or freeze the "
                               "version as 'merged'", "form")
            own = ov.csv()
            paths = [OVERLAY_MARK if p == plan["layer"]["overlay"] else p for p in plan["layer"]["files"]]
            fname = base.table.name
        elif form == "merged":
            own = base.csv()
            paths = [OVERLAY_MARK]
            fname = f"merged_{base.table.name}"
        else:
            raise Invalid(f"form: a version is deployed as 'layer' or 'merged', not {form!r}", "form")
        files.append(_file(ov.family.name, ov.family.env_var, fname, ov.csv(), own, paths))
    if not files:
        raise Conflict("the image has no overlay rows to version yet", "families")
    same = _same_version(s, digest, form, files)
    if same is not None:
        return version_dict(same), False
    v = OverlayVersion(image_digest=digest, form=form, state=st.VersionState.CANDIDATE.value, files=files,
                       note="snapshot of the overlay", created_at=_now())
    s.add(v)
    s.flush()
    return version_dict(v), True


def get_version(s: Session, vid: int) -> OverlayVersion:
    v = s.get(OverlayVersion, vid)
    if v is None:
        raise NotFound(f"version: no version {vid}", "version")
    return v


def promoted(s: Session, digest: str) -> OverlayVersion | None:
    return s.scalars(select(OverlayVersion).where(OverlayVersion.image_digest == digest,
                                                  OverlayVersion.state == st.VersionState.PROMOTED.value)
                     .order_by(OverlayVersion.id.desc())).first()


def versions(s: Session, digest: str) -> list[dict[str, Any]]:
    """Every version of the image, newest first, with its A/B history."""
    runs: dict[int, list[dict]] = {}
    for r in s.scalars(select(AbRun).where(AbRun.image_digest == digest).order_by(AbRun.id)):
        runs.setdefault(r.version_id, []).append(
            {"id": r.id, "state": r.state, "verdict": _verdict(r)[0], "reason": _verdict(r)[1],
             "baseline_version_id": r.baseline_version_id})
    out = []
    for v in s.scalars(select(OverlayVersion).where(OverlayVersion.image_digest == digest)
                       .order_by(OverlayVersion.id.desc())):
        out.append(version_dict(v) | {"runs": runs.get(v.id, [])})
    return out


def version_file(s: Session, vid: int, family: str) -> tuple[OverlayVersion, dict]:
    v = get_version(s, vid)
    f = next((f for f in v.files if f["family"] == family), None)
    if f is None:
        raise NotFound(f"family: version {vid} has no {family} file", "family")
    return v, f


def serving(s: Session, digest: str, family: str, version: str | None) -> tuple[OverlayVersion | None, dict | None]:
    """What the overlay download serves: the promoted version's file by default (when one is promoted and holds
    the family), 'latest' the overlay as built now, a number that version."""
    if version == "latest":
        return None, None
    if version is not None:
        try:
            vid = int(version)
        except ValueError:
            raise Invalid("version: 'latest' or a version id", "version") from None
        v, f = version_file(s, vid, family)
        if v.image_digest != digest:
            raise NotFound(f"version: no version {vid} of this image", "version")
        return v, f
    pv = promoted(s, digest)
    if pv is None:
        return None, None
    pf: dict | None = next((x for x in pv.files if x["family"] == family), None)
    return (pv, pf) if pf is not None else (None, None)


# ---- runs -------------------------------------------------------------------------------------------------------

def _captured_hist(s: Session, digest: str) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """The image's served load over its campaigns: steps per tokens-per-step bucket, requests per length bucket."""
    steps: dict[str, float] = {}
    lengths: dict[str, dict[str, float]] = {}
    for h, lh in s.execute(select(Campaign.step_hist, Campaign.length_hist).where(Campaign.image_digest == digest)):
        steps, lengths = served.merge(steps, h or {}), served.merge_lengths(lengths, lh or {})
    return steps, lengths


def create_run(s: Session, body: Any) -> dict[str, Any]:
    v = get_version(s, body.version_id)
    if v.image_digest != body.image_digest:
        raise Invalid("version_id: the version is of another image", "version_id")
    if body.baseline == "shipped":
        base_id = None
    elif body.baseline == "promoted":
        p = promoted(s, v.image_digest)
        base_id = p.id if p is not None and p.id != v.id else None
    else:
        b = get_version(s, int(body.baseline))
        if b.image_digest != v.image_digest:
            raise Invalid("baseline: the version is of another image", "baseline")
        base_id = b.id
    if base_id == v.id:
        raise Invalid("baseline: the baseline is the version under test", "baseline")
    if body.points:
        points, source = list(body.points), "given"
    else:
        hist, lengths = _captured_hist(s, v.image_digest)
        served_in, served_out = ab_gate.default_lengths(lengths)
        points = ab_gate.default_points(hist, body.input_len or served_in or ab_gate.DEFAULT_INPUT_LEN,
                                        body.output_len or served_out or ab_gate.DEFAULT_OUTPUT_LEN)
        source = {(True, True): "captured", (True, False): "captured steps", (False, True): "captured lengths",
                  (False, False): "default"}[(bool(hist), served_in is not None or served_out is not None)]
    names = [p.name for p in points]
    if len(set(names)) != len(names):
        raise Invalid("points: a band is given twice", "points")
    r = AbRun(image_digest=v.image_digest, version_id=v.id, baseline_version_id=base_id,
              state=st.RunState.CREATED.value, points=[p.model_dump(exclude_none=True) for p in points], points_source=source,
              repeats=body.repeats, requests_per_pass=body.requests_per_pass, confidence=body.confidence,
              power=body.power, min_requests=body.min_requests, seed=body.seed, max_loss=body.max_loss,
              max_repeats=body.max_repeats, target_mde=body.target_mde, min_effect=body.min_effect,
              start_order=list(ab_stats.draw_start_order()), created_at=_now(),
              updated_at=_now())
    s.add(r)
    s.flush()
    return run_dict(s, r)


def get_run(s: Session, rid: int, lock: bool = False) -> AbRun:
    q = select(AbRun).where(AbRun.id == rid)
    r = s.scalars(q.with_for_update() if lock else q).first()
    if r is None:
        raise NotFound(f"run: no A/B run {rid}", "run")
    return r


def _verdict(r: AbRun) -> tuple[str | None, str | None]:
    if r.state == st.RunState.INTERRUPTED.value:
        return ab_stats.Verdict.VOID.value, f"interrupted: {r.fault}"
    if r.result is None:
        return None, None
    return r.result["verdict"], r.result.get("reason")


def _passes_done(s: Session, rid: int) -> list[tuple[str, int, str]]:
    return [tuple(x) for x in s.execute(select(AbPass.band, AbPass.repeat, AbPass.arm)  # type: ignore[misc]
                                        .where(AbPass.run_id == rid).order_by(AbPass.id))]


def _run_load(s: Session, rid: int) -> str | None:
    """The load that measured the run's passes (None: none measured yet; a pass from before: own)."""
    first = s.execute(select(AbPass.load).where(AbPass.run_id == rid).order_by(AbPass.id).limit(1)).first()
    return None if first is None else first[0] or "own"


def n_requests(per_pass: int, point: OperatingPoint) -> int:
    """Requests in one pass of a band: the band's own, else the run's, and at least the band's concurrency, so the
    band is measured at its concurrency (fewer requests than that would never put `concurrency` in flight)."""
    return max(point.requests or per_pass, point.concurrency)


def rounds(r: AbRun) -> dict[str, int]:
    """Each band's rounds planned so far: the run's repeats, more for a band the stopping rule extended."""
    planned = r.band_rounds or {}
    names = [OperatingPoint(**p).name for p in r.points]
    return {name: int(planned.get(name, r.repeats)) for name in names}


def schedule(r: AbRun) -> list[tuple[str, int, str]]:
    """Every pass of the run in the order the driver measures them: band by band, rounds in ROUND_ORDERS (a band's
    extension rounds come after every band's first rounds: the order passes are planned in)."""
    out = []
    for name, k in rounds(r).items():
        out += [(name, rep, arm) for rep in range(min(k, r.repeats)) for arm in ab_stats.round_order(rep)]
    for name, k in rounds(r).items():
        out += [(name, rep, arm) for rep in range(r.repeats, k) for arm in ab_stats.round_order(rep)]
    return out


def _params(r: AbRun) -> ab_stats.GateParams:
    return ab_stats.GateParams(confidence=r.confidence, power=r.power, min_requests=r.min_requests,
                               looks=ab_stats.looks(r.repeats, r.max_repeats), min_effect=r.min_effect or 0.0)


def run_dict(s: Session, r: AbRun) -> dict[str, Any]:
    done = set(_passes_done(s, r.id))
    arms = {a.arm: a for a in s.scalars(select(AbArm).where(AbArm.run_id == r.id))}
    sched = schedule(r)
    per_pass = {OperatingPoint(**p).name: n_requests(r.requests_per_pass, OperatingPoint(**p)) for p in r.points}
    verdict, reason = _verdict(r)
    return {"id": r.id, "image_digest": r.image_digest, "version_id": r.version_id,
            "baseline_version_id": r.baseline_version_id, "state": r.state, "verdict": verdict, "reason": reason,
            "fault": r.fault, "points": r.points, "points_source": r.points_source, "repeats": r.repeats,
            "requests_per_pass": r.requests_per_pass, "confidence": r.confidence, "power": r.power,
            "min_requests": r.min_requests, "seed": r.seed, "max_loss": r.max_loss,
            "max_repeats": r.max_repeats or r.repeats, "target_mde": r.target_mde, "min_effect": r.min_effect or 0.0,
            "rounds": rounds(r), "start_order": r.start_order, "load": _run_load(s, r.id),
            "arms": {"A": r.baseline_version_id, "A_prime": r.baseline_version_id, "B": r.version_id},
            "passes_total": len(sched), "passes_done": len(done),
            "todo": [{"band": b, "repeat": k, "arm": a, "n_requests": per_pass[b]} for b, k, a in sched
                     if (b, k, a) not in done],
            "arms_posted": {a: {"answers": _answers(x) is not None} for a, x in arms.items()},
            "result": r.result, "rollback_version_id": r.rollback_version_id,
            "created_at": r.created_at.isoformat() if r.created_at else None}


def runs(s: Session, digest: str | None = None) -> list[dict[str, Any]]:
    q = select(AbRun).order_by(AbRun.id.desc())
    if digest:
        q = q.where(AbRun.image_digest == digest)
    out = []
    for r in s.scalars(q.limit(500)):
        verdict, reason = _verdict(r)
        out.append({"id": r.id, "image_digest": r.image_digest, "version_id": r.version_id,
                    "baseline_version_id": r.baseline_version_id, "state": r.state, "verdict": verdict,
                    "reason": reason, "bands": [OperatingPoint(**p).name for p in r.points]})
    return out


@contextmanager
def _refused(field: str = "state") -> Iterator[None]:
    """A transition app/domain/ab_states.py refuses is a 409 naming the field."""
    try:
        yield
    except TransitionError as e:
        raise Conflict(str(e), field) from None


def _transition(r: AbRun, to: st.RunState) -> None:
    r.state, r.updated_at = to.value, _now()


def start(s: Session, rid: int) -> dict[str, Any]:
    r = get_run(s, rid, lock=True)
    with _refused():
        _transition(r, st.start(st.RunState(r.state)))
    r.fault = None
    return run_dict(s, r)


def interrupt(s: Session, rid: int, reason: str) -> dict[str, Any]:
    r = get_run(s, rid, lock=True)
    with _refused():
        _transition(r, st.interrupt(st.RunState(r.state)))
    r.fault = reason
    return run_dict(s, r)


def post_pass(s: Session, rid: int, body: Any) -> tuple[dict[str, Any], bool]:
    """One pass, whole. A repeat of a stored pass with the same records is acknowledged (a driver that died after
    posting re-posts it); different records for a stored pass are a conflict: a pass is measured once."""
    r = get_run(s, rid, lock=True)
    with _refused():
        st.accept_pass(st.RunState(r.state))
    bands = {OperatingPoint(**p).name for p in r.points}
    if body.band not in bands:
        raise Invalid(f"band: {body.band!r} is not a band of run {rid} ({', '.join(sorted(bands))})", "band")
    planned = rounds(r)[body.band]
    if body.repeat >= planned:
        raise Invalid(f"repeat: band {body.band} of run {rid} has rounds 0..{planned - 1} planned", "repeat")
    for i, rec in enumerate(body.records):
        if (rec.arm, rec.band, rec.repeat) != (body.arm, body.band, body.repeat):
            raise Invalid(f"records[{i}]: arm/band/repeat differ from the pass's", f"records[{i}]")
    if (load := _run_load(s, rid)) not in (None, body.load):
        raise Conflict(f"load: run {rid}'s passes were measured by {load!r}, this one by {body.load!r}: one run's "
                       "intervals compare passes of one load (drive it with that load, or make a new run)", "load")
    records = [x.model_dump() for x in body.records]
    old = s.scalars(select(AbPass).where(AbPass.run_id == rid, AbPass.band == body.band,
                                         AbPass.repeat == body.repeat, AbPass.arm == body.arm)).first()
    if old is not None:
        if old.records == records:
            return {"stored": False, "pass_id": old.id}, False
        raise Conflict(f"pass {body.band}/{body.repeat}/{body.arm} is already stored with other records", "repeat")
    p = AbPass(run_id=rid, band=body.band, repeat=body.repeat, arm=body.arm, records=records, logs=body.logs,
               probe=body.probe.model_dump() if body.probe else None, load=body.load, created_at=_now())
    s.add(p)
    r.updated_at = _now()
    s.flush()
    return {"stored": True, "pass_id": p.id}, True


def post_arm(s: Session, rid: int, body: Any) -> dict[str, Any]:
    """An arm's server log from start through warm-up (appended per rank: a restarted server logs its start
    again) and its greedy answers to the accuracy prompts (the latest kept)."""
    r = get_run(s, rid, lock=True)
    with _refused():
        st.accept_pass(st.RunState(r.state))
    a = s.scalars(select(AbArm).where(AbArm.run_id == rid, AbArm.arm == body.arm)).first()
    if a is None:
        a = AbArm(run_id=rid, arm=body.arm, logs={}, created_at=_now())
        s.add(a)
    logs = dict(a.logs)
    for rank, text in body.logs.items():
        logs[rank] = logs.get(rank, "") + text
    a.logs = logs
    if body.answers is not None:
        a.answers = [x.model_dump() for x in body.answers]
    s.flush()
    return {"arm": body.arm, "ranks": sorted(logs)}


def _answers(a: AbArm) -> list[Answer] | None:
    """The arm's answers; a run posted before they carried logprobs has its greedy tokens only (first_tokens),
    which then must equal A's exactly, as they were checked then."""
    if a.answers is not None:
        return [Answer(**x) for x in a.answers]
    return None if a.first_tokens is None else [Answer(tokens=t[:256]) for t in a.first_tokens]


def _rows_of(f: dict) -> list[dict[str, str]]:
    return read_table(f["own"]).rows if f["own"].strip() else []


def _measured(s: Session, rid: int) -> tuple[dict[str, dict[tuple[int, str], list[RequestRecord]]], dict[str, str]]:
    """The run's records by band and (round, arm), and arm B's measured windows' log per rank."""
    by_band: dict[str, dict[tuple[int, str], list[RequestRecord]]] = {}
    windows: dict[str, str] = {}
    for p in s.scalars(select(AbPass).where(AbPass.run_id == rid).order_by(AbPass.id)):
        by_band.setdefault(p.band, {})[(p.repeat, p.arm)] = [RequestRecord(**x) for x in p.records]
        if p.arm == "B":
            for rank, text in p.logs.items():
                windows[rank] = windows.get(rank, "") + text
    return by_band, windows


def _engagement(v: OverlayVersion, arms: dict[str, AbArm], windows: dict[str, str], points: list[OperatingPoint]
                ) -> ab_gate.Engagement:
    """Did B engage: its start/warm-up log and windows against the version's rows and the bands' batch sizes."""
    fams = {f["family"]: (get_family(f["family"]), _rows_of(f)) for f in v.files}
    b_logs = dict(arms["B"].logs) if "B" in arms else {}
    for rank, text in windows.items():
        b_logs[rank] = b_logs.get(rank, "") + text
    sizes = sorted({b for p in points for b in ab_gate.batch_sizes(p, points)})
    return ab_gate.engagement(fams, b_logs, windows, sizes)


def _result(res: ab_stats.RunResult, eng: ab_gate.Engagement, acc: str | None,
            checks: dict[str, ab_gate.AnswerCheck], arms: dict[str, AbArm], max_loss: float) -> dict[str, Any]:
    result = res.as_dict() | {
        "engagement": {"ok": eng.ok, "reason": eng.reason, "note": eng.note,
                       "ranks": [{"rank": x.rank, "hits": x.hits, "rows_hit": x.rows_hit, "other_hits": x.other_hits,
                                  "misses": x.misses, "jit": x.jit} for x in eng.ranks]},
        "accuracy": {"ok": acc is None, "reason": acc, "prompts": len(_answers(arms["A"]) or []) if "A" in arms else 0,
                     "tolerance": {"tie_nats": ab_gate.TIE_NATS, "logprob_tol": ab_gate.LOGPROB_TOL,
                                   "max_flip_frac": ab_gate.MAX_FLIP_FRAC},
                     "arms": {arm: {"flips": x.flips, "departed": len(x.departed), "shifted": len(x.shifted)}
                              for arm, x in checks.items()}},
        "promotable": None}
    result["max_loss"] = max_loss
    result["promotable"] = ab_stats.promotable(result, max_loss)
    return result


def assess(s: Session, r: AbRun) -> tuple[dict[str, Any], ab_stats.RunResult, list[OperatingPoint], OverlayVersion]:
    """The run's verdicts from its stored passes and arms, nothing written: per band (B and the control against A
    at the band's concurrency), engagement, accuracy, promotability."""
    params, planned = _params(r), rounds(r)
    by_band, windows = _measured(s, r.id)
    points = [OperatingPoint(**p) for p in r.points]
    bands = [ab_stats.analyse_band(p.name, by_band.get(p.name, {}), planned[p.name], len(points), params,
                                   p.concurrency) for p in points]
    arms = {a.arm: a for a in s.scalars(select(AbArm).where(AbArm.run_id == r.id))}
    v = get_version(s, r.version_id)
    eng = _engagement(v, arms, windows, points)
    void = [eng.reason] if eng.reason else []
    acc, checks = ab_gate.accuracy({a: _answers(x) for a, x in arms.items()})
    if acc:
        void.append(acc)
    res = ab_stats.run_verdict(bands, void)
    return _result(res, eng, acc, checks, arms, r.max_loss), res, points, v


def _extend(r: AbRun, res: ab_stats.RunResult) -> dict[str, int]:
    """The stopping rule's answer once every planned pass is in: the bands to measure on (undecided, below
    max_repeats) and their new planned rounds; none when the run is void anyway (control, engagement, accuracy:
    more rounds would not book it)."""
    if res.verdict is ab_stats.Verdict.VOID:
        return {}
    planned, cap = rounds(r), r.max_repeats or r.repeats
    target = r.target_mde if r.target_mde is not None else float("inf")
    return {b.band: min(cap, planned[b.band] + ab_stats.EXTEND_ROUNDS) for b in res.bands
            if planned[b.band] < cap and ab_stats.undecided(b, target, r.max_loss)}


def finish(s: Session, rid: int) -> dict[str, Any]:
    """Once every planned pass is measured: extend the undecided bands (sequential rounds: the run goes on driving,
    its todo the new rounds), or book the run: verdicts per band, the control, engagement, accuracy; a regressing
    band proposes a rollback version. Nothing is booked while a pass is missing."""
    r = get_run(s, rid, lock=True)
    done = set(_passes_done(s, rid))
    missing = [x for x in schedule(r) if x not in done]
    with _refused():
        to = st.book(st.RunState(r.state), len(missing))
    result, res, points, v = assess(s, r)
    if more := _extend(r, res):
        r.band_rounds = rounds(r) | more
        r.updated_at = _now()
        s.flush()
        return run_dict(s, r) | {"extended": more}
    _transition(r, to)
    r.result = result
    regressing = [p for p, b in zip(points, res.bands) if b.verdict is ab_stats.Verdict.REGRESSION]
    if res.verdict is not ab_stats.Verdict.VOID and regressing:
        r.rollback_version_id = _rollback(s, v, regressing, points, r.id).id
    if result["promotable"] is not None and v.state == st.VersionState.CANDIDATE.value:
        v.state = st.reject(st.VersionState(v.state)).value
    s.flush()
    return run_dict(s, r)


def _rollback(s: Session, v: OverlayVersion, bands: list[OperatingPoint], points: list[OperatingPoint], rid: int
              ) -> OverlayVersion:
    """A new version without the rows whose padded-M buckets serve the regressing bands' batch sizes."""
    sizes = sorted({b for p in bands for b in ab_gate.batch_sizes(p, points)})
    files, withdrawn = [], []
    for f in v.files:
        fam = get_family(f["family"])
        own = read_table(f["own"]) if f["own"].strip() else Table(())
        drop = set(ab_gate.rows_serving(fam, own.rows, sizes))
        keep = [row for i, row in enumerate(own.rows) if i not in drop]
        gone = [own.rows[i] for i in sorted(drop)]
        withdrawn += [{"family": f["family"], "row": row} for row in gone]
        own_csv = render_csv(own.header, keep)
        if v.form == "merged":  # the deployed file less exactly the withdrawn rows
            dep = read_table(f["content"])
            content = render_csv(dep.header, [row for row in dep.rows if row not in gone])
        else:
            content = own_csv
        if keep:
            files.append(_file(f["family"], f["env_var"], f["name"], content, own_csv, f["paths"]))
    names = ", ".join(p.name for p in bands)
    note = (f"rollback of version {v.id} after run {rid}: without the {len(withdrawn)} row(s) whose padded-M "
            f"buckets serve batch sizes {sizes[0]}..{sizes[-1]} (band(s) {names})")
    same = _same_version(s, v.image_digest, v.form, files) if files else None
    if same is not None:
        return same
    nv = OverlayVersion(image_digest=v.image_digest, form=v.form, state=st.VersionState.CANDIDATE.value,
                        files=files, parent_id=v.id, note=note, withdrawn=withdrawn, created_at=_now())
    s.add(nv)
    s.flush()
    return nv


def promote(s: Session, rid: int) -> dict[str, Any]:
    r = get_run(s, rid, lock=True)
    if r.state != st.RunState.BOOKED.value or r.result is None:
        raise Conflict(f"run {rid} is {r.state}: only a booked run promotes its version", "run")
    why = r.result.get("promotable")
    if why:
        raise Conflict(f"version {r.version_id} is not promoted: {why}", "run")
    v = get_version(s, r.version_id)
    old = promoted(s, v.image_digest)
    if old is not None and old.id != v.id:
        old.state = st.VersionState.SUPERSEDED.value
    with _refused("version"):
        v.state = st.promote(st.VersionState(v.state)).value
    v.promoted_at, v.promoted_run_id = _now(), r.id
    s.flush()
    return version_dict(v)


def validation_error(e: ValidationError) -> Invalid:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    return Invalid(f"{loc}: {err['msg']}", loc)


ARM_NAMES = ARMS
