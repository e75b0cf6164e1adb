"""Engagement: before deploy, rebuild AITER's lookup key per captured shape; after, count log hits."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.schemas import EngagementProofIn
from app.db.session import Database
from app.db.models import Campaign, CampaignShape, Capture, EngagementProof, Image
from app.domain.families import LookupIdentity, TableFamily, get_family, lookup_identity
from app.domain.keys import m_candidates
from app.domain import engagement as eng
from app.domain.log_lines import parse_log
from app.domain.shapes import ShapeError, make_shape
from app.domain import ab_gate, deploy, log_ranks
from app.domain.deploy import FORMS
from app.domain.tables import Table, read_table, rows_digest
from app.errors import Invalid
from app.services import campaigns, overlays, page_totals, pages
from app.services.caches import caches_of
from app.services.lookups import campaign_or_404, family_or_422


@dataclass
class Verdicts:
    camp: Campaign
    ov: overlays.Overlay
    ident: dict
    used: str  # the form (or "supplied")
    refused: str | None
    warnings: list[str]
    shapes: Sequence[Any]  # rows with id, shape, priority, state (_SHAPES)
    checks: list[eng.ShapeEngagement]
    table: Table  # the table checked

    def rules(self) -> str:
        """A digest of everything besides the shape that decides a shape's verdict (the arguments of
        eng.check): the release's rules, the table as checked, the serving environment, a refusal. A form's
        table digest is made once per built overlay (overlays.Overlay.digest)."""
        table = rows_digest(self.table) if self.used == "supplied" else self.ov.digest(self.used)
        return hashlib.blake2b(json.dumps(
            [self.ov.release.name, self.ov.family.name, list(self.ov.schema.key_columns), self.refused, self.ident,
             self.camp.gfx, self.camp.cu_num, list(self.table.header), table], sort_keys=True, default=str).encode(),
            digest_size=16).hexdigest()


# what a verdict reads of each shape: plain rows, not ORM objects (a 100k-shape campaign loads 2x faster)
_SHAPES = (CampaignShape.id, CampaignShape.shape, CampaignShape.priority, CampaignShape.state)


def shapes_version(counts: dict[str, campaigns.StateCounts]) -> tuple:
    """The campaign's shapes as the totals see them, from its campaigns.shape_counts: how many (shapes are only
    added, and never change), their served times (a capture or a measured default moves them)."""
    by = [counts[st] for st in sorted(counts)]  # summed in one order: the count and the page compare them
    return (sum(c.n for c in by), f"{sum(c.served for c in by):.12g}",  # rounded: the engine's sums may differ
            f"{sum(c.placed for c in by):.12g}")  # in the last bits between two reads of the same rows


def proved_verdict(r: dict) -> str:
    """hit, raises or miss, of one shape of a proof."""
    return "raises" if r.get("raised") else "hit" if r["hit"] else "miss"


def disagrees(c: eng.ShapeEngagement, r: dict | None, proof: EngagementProof, refused: str | None) -> bool:
    """Whether the proof disagrees with the prediction c on a shape (r: the proof's result for it, None: not
    probed). AITER raising at start agrees only with a refused form; a shape the proof did not probe disagrees;
    else the verdicts must be the same, and the row AITER's lookup returned must be the row predicted (a hit's
    kernel included). A row found that the probe does not run (its kernel would raise) is not told apart."""
    if proof.error:
        return refused is None
    if r is None or refused is not None:
        return True
    if c.verdict == "unknown":  # it depends on what the proof's call does not say either (ShapeEngagement.unknown)
        return False
    theirs = proved_verdict(r)
    if theirs != c.verdict and not (theirs == "miss" and c.verdict == "raises" and c.row is not None
                                    and r.get("row") is not None):
        return True
    if theirs == "hit" and r.get("kernel") is not None and r["kernel"] != (_kernel(c.row) or ""):
        return True
    return r.get("row") is not None and not (c.row is not None and eng.same_row(r["row"], c.row))


def _totals(v: Verdicts, proof: EngagementProof | None) -> dict:
    """The totals over every shape of v (checked without `only`)."""
    proved = {r["shape_id"]: r for r in proof.results} if proof is not None else {}
    total = sum(x.priority for x in v.shapes) or 1.0
    return {"hits": sum(c.hit for c in v.checks), "misses": sum(c.verdict == "miss" for c in v.checks),
            "raises": sum(c.verdict == "raises" for c in v.checks),
            "unknown": sum(c.verdict == "unknown" for c in v.checks),
            "served_time_covered": sum(x.priority for x, c in zip(v.shapes, v.checks) if c.hit) / total,
            "disagreements": None if proof is None else sum(
                disagrees(c, proved.get(x.id), proof, v.refused) for x, c in zip(v.shapes, v.checks))}


def _version(v: Verdicts, shapes: tuple, proof: EngagementProof | None) -> tuple:
    """Everything that decides the totals (the page_totals version): the rules and table, the shapes, the proof."""
    return v.rules(), shapes, proof.id if proof is not None else None


def _count(campaign_id: int, form: str | None, table_csv: str | None) -> page_totals.Counter:
    def count(s: Session) -> tuple[tuple, dict]:
        shapes = shapes_version(campaigns.shape_counts(s, campaign_id).get(campaign_id, {}))
        v = verdicts(s, campaign_id, table_csv=table_csv, form=form)
        proof = latest_proof(s, campaign_id, v.used)
        return _version(v, shapes, proof), _totals(v, proof)
    return count


def _every_or_page(s: Session, db: Database | None, campaign_id: int, page: list, merged: bool = False,
                   table_csv: str | None = None, form: str | None = None,
                   counts: dict[str, campaigns.StateCounts] | None = None
                   ) -> tuple[Verdicts, EngagementProof | None, page_totals.Shown, int]:
    """The verdicts and the totals over every shape: within the request for a small campaign (or without a
    database to count in), else for the page's shapes only, the totals from the app's caches.totals
    (app/services/caches.py). counts: the campaign's campaigns.shape_counts where the caller has them. Returns
    (verdicts, latest proof, page_totals.Shown, the number of shapes)."""
    if counts is None:
        counts = campaigns.shape_counts(s, campaign_id).get(campaign_id, {})
    shapes = shapes_version(counts)
    every = _inline(db, shapes)
    v = verdicts(s, campaign_id, merged, table_csv, form, only=None if every else page)
    proof = latest_proof(s, v.camp.id, v.used)
    if every:
        return v, proof, page_totals.Shown(_totals(v, proof), None, None), shapes[0]
    assert db is not None
    return v, proof, _counted(db, v, shapes, proof, table_csv), shapes[0]


def _inline(db: Database | None, shapes: tuple) -> bool:
    """The totals are counted within the request: a small campaign (shapes: shapes_version), or no database."""
    return db is None or shapes[0] <= page_totals.INLINE_MAX


def _counted(db: Database, v: Verdicts, shapes: tuple, proof: EngagementProof | None,
             table_csv: str | None = None) -> page_totals.Shown:
    """A large campaign's totals over every shape, as the app's caches.totals keeps them for v's slot."""
    what = v.used if table_csv is None else "supplied:" + hashlib.sha256(table_csv.encode()).hexdigest()
    return caches_of(db).totals.get(db, (v.camp.id, what), _version(v, shapes, proof), _count(
        v.camp.id, v.used if table_csv is None else None, table_csv))


def pre_deploy(s: Session, campaign_id: int, merged: bool = False, table_csv: str | None = None,
               form: str | None = None, limit: int = pages.DEFAULT_LIMIT, after: str | None = None,
               db: Database | None = None) -> tuple[dict, Callable[[], None] | None]:
    """The verdict per captured shape on the table AITER builds from a deploy form (the plan's first offered
    one unless asked); table_csv: check a table as written (a hand-made or older overlay) instead. One page of
    shapes is checked; the totals over every shape come from a count off the request (_every_or_page).
    Returns the report and what starts a due count (run it after the report is sent)."""
    camp = campaign_or_404(s, campaign_id)
    rows, nxt = pages.keyset(s, select(*_SHAPES).where(CampaignShape.campaign_id == camp.id), limit, after)
    v, proof, shown, n = _every_or_page(s, db, camp.id, rows, merged=merged, table_csv=table_csv, form=form)
    checked = {x.id: c for x, c in zip(v.shapes, v.checks)}
    proved = {r["shape_id"]: r for r in proof.results} if proof is not None else {}
    t = shown.totals or dict.fromkeys(("hits", "misses", "raises", "unknown", "served_time_covered", "disagreements"))
    ov, ident = v.ov, v.ident
    return {
        "campaign_id": camp.id, "image_digest": camp.image_digest, "family": camp.family, "gfx": camp.gfx,
        "cu_num": camp.cu_num, "env_var": ov.family.env_var, "release": ov.release.name,
        "table": v.used, "form": v.used, "refused": v.refused,
        "warnings": v.warnings + ident["mismatches"], "identity": ident,
        "header": list(ov.schema.header), "shapes": n,
        "hits": t["hits"], "misses": t["misses"], "raises": t.get("raises"), "unknown": t.get("unknown"),
        "served_time_covered": t["served_time_covered"],
        "totals_pending": shown.pending, "totals_stale_s": shown.stale_s,
        "proof": None if proof is None else {
            "id": proof.id, "aiter_commit": proof.aiter_commit, "aiter_version": proof.aiter_version,
            "worker_id": proof.worker_id, "flydsl": proof.flydsl, "error": proof.error,
            "created_at": proof.created_at.isoformat(), "disagreements": t["disagreements"]},
        "report": [{"shape_id": x.id, "shape": x.shape, "state": x.state, "hit": c.hit, "verdict": c.verdict,
                    "tried_m": c.tried_m,
                    "matched_m": c.matched_m, "reason": c.reason, "kernel": _kernel(c.row),
                    "proved_hit": proved[x.id]["hit"] if x.id in proved else None,
                    "proved_verdict": proved_verdict(proved[x.id]) if x.id in proved else None,
                    "proved_kernel": proved[x.id].get("kernel") if x.id in proved else None,
                    "proved_raised": proved[x.id].get("raised") if x.id in proved else None,
                    "proved_row": proved[x.id].get("row") if x.id in proved else None,
                    "disagrees": proof is not None and disagrees(c, proved.get(x.id), proof, v.refused)}
                   for x in rows for c in (checked[x.id],)],
        "next": nxt,  # the report is paged (limit, after); the totals above cover every shape
    }, shown.start


def verdicts(s: Session, campaign_id: int, merged: bool = False, table_csv: str | None = None,
             form: str | None = None, only: list | None = None) -> Verdicts:
    """only: the shape rows to check (default: every shape of the campaign)."""
    camp = campaign_or_404(s, campaign_id)
    ident = runtime_identity(s, camp)
    ov = overlays.build(s, camp.image_digest, camp.family, gfx=ident["gpu_gfx"])
    if form is None:
        form = "merged" if merged else None
    if form is not None and form not in FORMS:
        raise Invalid(f"form: one of {', '.join(FORMS)}", "form")
    table, used, refused, warnings = (_supplied(ov, table_csv) if table_csv is not None else _built(ov, form))
    shapes = only if only is not None else s.execute(
        select(*_SHAPES).where(CampaignShape.campaign_id == camp.id)
        .order_by(CampaignShape.priority.desc(), CampaignShape.id)).all()
    checks, refused = _checked(camp, ov, ident, used, table, [x.shape for x in shapes], refused)
    return Verdicts(camp, ov, ident, used, refused, warnings, shapes, checks, table)


def _supplied(ov: overlays.Overlay, table_csv: str) -> tuple[Table, str, str | None, list[str]]:
    """A table as written (table, "supplied", no refusal, its header's warnings); a row AITER could not run is
    refused (422 naming the row's cell), not predicted."""
    try:
        table = read_table(table_csv, "supplied", ov.family.comment_prefix)
    except ValueError as e:
        raise Invalid(f"body: {e}", "body") from None
    for i, row in enumerate(table.rows):
        bad = ov.family.unreadable(row)
        if bad is not None:
            raise Invalid(f"body.rows.{i}.{bad[0]} (CSV line {i + 2}): {bad[1]}", f"body.rows.{i}.{bad[0]}")
    return table, "supplied", None, ov.schema.header_problems(table.header)


def _built(ov: overlays.Overlay, form: str | None) -> tuple[Table, str, str | None, list[str]]:
    """The table AITER builds from a deploy form (default: the deploy plan's choice), the form, its refusal."""
    arts = ov.artifacts()
    form = form or deploy.first_offered(arts, ov.shipped.known) or "layer"
    art = arts[form]
    return (art.table if art.table is not None else Table(ov.table.header)), form, art.refused, []


def _checked(camp: Campaign, ov: overlays.Overlay, ident: dict[str, Any], used: str, table: Table,
             shapes: list[dict[str, str]], refused: str | None) -> tuple[list[eng.ShapeEngagement], str | None]:
    """eng.check of the shapes on the table as the runtime identity sees it; (the verdicts, the refusal): a
    loader that raises, or a serving environment AITER raises in, refuses the form (nothing engages)."""
    cpp_at = (camp.gfx, camp.cu_num)
    targets = tuple((str(t[0]), int(t[1])) for t in ident["build_targets"]) or (cpp_at,)
    try:
        checks = eng.check(ov.family, ov.schema.key_columns, ident["lookup_gfx"], ident["lookup_cu_num"],
                           shapes, table, flydsl=ident["flydsl"], cpp_at=cpp_at,
                           build_targets=targets,  # the built form's table is prepared once (Overlay.lookup)
                           prepared=None if used == "supplied" else ov.lookup(used, ident["lookup_gfx"], targets),
                           arch=ident["lookup_arch"], env=ident["env"])
    except eng.LookupRaises as e:
        refused = f"AITER's loader raises on this table: {e}"
        checks = [eng.ShapeEngagement(x, False, [], reason=refused) for x in shapes]
    if refused is None and ident["lookup_error"]:
        refused = f"AITER raises in this serving environment: {ident['lookup_error']}"
    if refused is None and ident["miss_error"]:  # a shape without a row takes a path that raises
        for c in checks:
            if not c.hit:
                c.fails, c.reason = True, f"no row, and the default path raises here: {ident['miss_error']}"
    if refused is not None:  # AITER raises at start: nothing engages
        checks = [eng.ShapeEngagement(c.shape, False, c.tried_m, reason=refused) for c in checks]
    return checks, refused


def _kernel(row: dict | None) -> str | None:
    return (row or {}).get("kernelName") or (row or {}).get("kernelName1")


def latest_proof(s: Session, campaign_id: int, form: str) -> EngagementProof | None:
    return s.scalars(select(EngagementProof).where(EngagementProof.campaign_id == campaign_id,
                                                   EngagementProof.form == form)
                     .order_by(EngagementProof.id.desc())).first()


def record_proof(s: Session, campaign_id: int, body: EngagementProofIn) -> dict:
    """AITER's own lookup in the image, per captured shape of this campaign; shapes named must be its own."""
    camp = campaign_or_404(s, campaign_id)
    ids = set(s.scalars(select(CampaignShape.id).where(CampaignShape.campaign_id == camp.id)))
    for i, r in enumerate(body.results):
        if r.shape_id not in ids:
            raise Invalid(f"results.{i}.shape_id: {r.shape_id} is not a shape of campaign {camp.id}",
                          f"results.{i}.shape_id")
    p = EngagementProof(campaign_id=camp.id, form=body.form, worker_id=body.worker_id, aiter_commit=body.aiter_commit,
                        aiter_version=body.aiter_version, flydsl=body.flydsl, error=body.error,
                        results=[r.model_dump() for r in body.results])
    s.add(p)
    s.flush()
    return {"id": p.id, "campaign_id": camp.id, "form": p.form, "shapes": len(p.results),
            "hits": sum(r.hit for r in body.results), "raises": sum(bool(r.raised) for r in body.results)}


def runtime_identity(s: Session, camp: Campaign) -> dict[str, Any]:
    """gfx and cu_num the way the server's AITER will see them, from the environment its last capture sent
    (families.lookup_identity: GPU_ARCHS for get_gfx() families, CU_NUM for Python lookups, build targets for
    the compiled tables, which the device itself is asked for)."""
    cap = s.scalars(select(Capture).where(Capture.campaign_id == camp.id).order_by(Capture.id.desc())).first()
    env: dict[str, str] = dict(cap.env) if cap and cap.env else {}
    fam = get_family(camp.family)
    li = lookup_identity(fam, camp.gfx, camp.cu_num, env)
    notes = _identity_notes(fam, camp, env, li)
    img = s.get(Image, camp.image_digest)
    # the worker checks AITER's is_flydsl_available() in the image itself; a server's capture may say so too
    flydsl = (img.flydsl if img is not None and img.flydsl is not None else
              env.get("flydsl", env.get("FLYDSL", "")).strip().lower() not in ("0", "false", "no", "absent"))
    if cap and cap.aiter_version and img and img.aiter_version and cap.aiter_version != img.aiter_version:
        notes.append(f"the server reports AITER {cap.aiter_version}, the image's worker {img.aiter_version}: "
                     "rows are only valid in the image they were measured in")
    return {"gpu_gfx": camp.gfx, "gpu_cu_num": camp.cu_num, "lookup_gfx": li.gfx, "lookup_cu_num": li.cu_num,
            "lookup_arch": li.arch,
            "build_targets": [list(t) for t in li.build_targets], "miss_error": li.miss_error,
            # both, where both raise: which one the server meets first depends on what it calls first
            "lookup_error": "; ".join(e for e in (li.error, li.build_error if fam.compiled else None) if e) or None,
            "flydsl": flydsl, "env": env, "mismatches": notes}


def _identity_notes(fam: TableFamily, camp: Campaign, env: dict[str, str], li: LookupIdentity) -> list[str]:
    """Where the serving environment makes AITER look up another GPU than the campaign's, or raise."""
    notes = []
    if li.error:
        notes.append(f"GPU_ARCHS={env.get('GPU_ARCHS')!r} CU_NUM={env.get('CU_NUM')!r}: AITER's lookup raises "
                     f"({li.error}); fix the serving environment")
    if li.gfx != camp.gfx:
        notes.append(f"GPU_ARCHS={env['GPU_ARCHS']}: AITER looks up gfx={li.gfx} (its last entry), not the GPU's "
                     f"{camp.gfx}; unset GPU_ARCHS in the serving environment or every row misses")
    if li.cu_num != camp.cu_num:
        notes.append(f"CU_NUM={env.get('CU_NUM')}: Python lookups use cu_num={li.cu_num}, the GPU has {camp.cu_num}"
                     + (" and the compiled C++ table uses the GPU's: they disagree" if fam.compiled else ""))
    if fam.compiled and li.build_error:
        notes.append(f"building the compiled table raises: {li.build_error}")
    elif fam.compiled and (camp.gfx, camp.cu_num) not in li.build_targets:
        notes.append(f"the compiled table is built for {list(li.build_targets)} (GPU_ARCHS/CU_NUM), the GPU is "
                     f"{camp.gfx}/{camp.cu_num}: its kernels come from none of the rows")
    return notes


def _log_counts(fam: TableFamily, log: str) -> tuple[dict[str, dict[str, Any]], int]:
    """AITER's hit and miss lines of fam in a server log, per shape (its key); and the lines no shape parses from."""
    counts: dict[str, dict[str, Any]] = {}
    skipped = 0
    for ev in parse_log(log).events:
        if ev.family != fam.name:
            continue
        try:
            shape = make_shape(fam, ev.shape, "log")
        except ShapeError:
            skipped += 1
            continue
        c = counts.setdefault(shape.key, {"shape": shape.as_dict(), "hits": 0, "misses": 0, "files": set()})
        c["hits" if ev.hit else "misses"] += 1
        if ev.file:
            c["files"].add(ev.file)
    return counts, skipped


def _predicted(s: Session, camp: Campaign | None, gfx: str, deploy_form: str | None
               ) -> tuple[dict[tuple[Any, ...], tuple[Any, bool, bool, bool]], str | None, dict[str, str]]:
    """The campaign's verdicts keyed as the log prints the shapes (MoE: the padded token): (shape row, hit, fails,
    a row found); the form checked; the serving environment."""
    predicted: dict[tuple[Any, ...], tuple[Any, bool, bool, bool]] = {}
    if camp is None:
        return predicted, None, {}
    v = verdicts(s, camp.id, form=deploy_form)
    env = v.ident["env"]
    for x, c in zip(v.shapes, v.checks):
        predicted.setdefault(_as_logged(v.ov.family, x.shape, gfx, env), (x, c.hit, c.fails, c.row is not None))
    return predicted, v.used, env


def _observed(c: dict[str, Any], x: Any, hit: bool | None, fails: bool, found: bool) -> dict[str, Any]:
    """One shape's log counts beside its prediction (hit None: no prediction)."""
    observed = "hit" if c["hits"] and not c["misses"] else "miss" if c["misses"] and not c["hits"] else "mixed"
    # a row AITER finds is logged as used even where its kernel then raises, or the op's dispatch then runs
    # another kernel (a MoE stage route, a libtype the op does not run)
    logged = hit or fails or found
    return {"shape": c["shape"], "hits": c["hits"], "misses": c["misses"], "files": sorted(c["files"]),
            "shape_id": x.id if x is not None else None, "state": x.state if x is not None else None,
            "observed": observed, "predicted_hit": hit, "predicted_fails": fails,
            "disagrees": hit is not None and observed != "mixed" and (observed == "hit") != logged}


def post_deploy(s: Session, digest: str, gfx: str, cu_num: int, family: str, log: str,
                deploy_form: str | None = None, ranks: int = 1) -> dict[str, Any]:
    """Per-shape counts of AITER's hit and miss lines in a server log taken after deploy; and per rank (the log's
    lines split by their worker prefixes, app/domain/log_ranks.py; `ranks` the server runs, each expected to
    log): hits, misses, the shapes the overlay serves that the rank missed, JIT builds; and the alerts."""
    fam = family_or_422(family)
    counts, skipped = _log_counts(fam, log)
    camp = s.scalars(select(Campaign).where(Campaign.image_digest == digest, Campaign.gfx == gfx,
                                            Campaign.cu_num == cu_num, Campaign.family == fam.name)).first()
    predicted, form, env = _predicted(s, camp, gfx, deploy_form)
    none: tuple[Any, bool | None, bool, bool] = (None, None, False, False)

    def observe(c: dict[str, Any]) -> dict[str, Any]:
        return _observed(c, *predicted.get(_as_logged(fam, c["shape"], gfx, env), none))
    report = [observe(c) for c in counts.values()]
    per_rank = [_rank_view(fam, rank, text, observe) for rank, text in
                log_ranks.by_rank({log_ranks.MAIN: log}, ranks).items()]
    return {"family": fam.name, "env_var": fam.env_var, "campaign_id": camp.id if camp else None, "form": form,
            "shapes": len(report), "hit_lines": sum(r["hits"] for r in report),
            "miss_lines": sum(r["misses"] for r in report), "unparsable_lines": skipped,
            "disagreements": sum(r["disagrees"] for r in report), "report": report,
            "ranks": per_rank, "alerts": _serving_alerts(fam, per_rank),
            "note": "hit lines appear only with AITER_LOG_TUNED_CONFIG=1 set before `import aiter`; 'predicted_hit' "
                    f"is the service's verdict on the {form or 'layer'} form; a disagreement is a defect of the model"}


def _rank_view(fam: TableFamily, rank: str, text: str, observe: Callable[[dict[str, Any]], dict[str, Any]]
               ) -> dict[str, Any]:
    """One rank's share of a post-deploy log: its lookup lines, the shapes the overlay serves (predicted hit)
    that it logged only misses for, and its JIT build lines (ab_gate.JIT_LINES)."""
    seen = [observe(c) for c in _log_counts(fam, text)[0].values()]
    missed = [x["shape"] for x in seen if x["predicted_hit"] and x["misses"] and not x["hits"]]
    return {"rank": rank, "hit_lines": sum(x["hits"] for x in seen), "miss_lines": sum(x["misses"] for x in seen),
            "missed_served": len(missed), "missed_shapes": missed[:20], "jit": ab_gate.jit_lines(text)}


def _serving_alerts(fam: TableFamily, ranks: list[dict[str, Any]]) -> list[str]:
    """What a person must see: a rank that missed shapes the overlay serves (its files did not take there), a
    rank that built kernels while serving (a JIT build stalls its requests), a rank that logged no lookup."""
    out = []
    for r in ranks:
        if r["missed_served"]:
            out.append(f"rank {r['rank']} missed {r['missed_served']} shape(s) the overlay serves (its files did "
                       "not take on that rank)")
        built = {k: v for k, v in r["jit"].items() if v}
        if built:
            out.append(f"rank {r['rank']} built kernels while serving ("
                       + ", ".join(f"{k}: {v} line(s)" for k, v in built.items()) + ")")
        if not r["hit_lines"] and not r["miss_lines"]:
            out.append(f"rank {r['rank']} logged no {fam.name} lookup line (its log missing, or "
                       "AITER_LOG_TUNED_CONFIG=1 not set there)")
    return out


def _as_logged(family: TableFamily, shape: dict[str, str], gfx: str, env: dict[str, str] | None = None) -> tuple:
    """A shape as AITER's log lines print it: raw M for GEMMs, the looked-up (padded) token for MoE, the
    arguments as the op on gfx hands them to the lookup (TableFamily.op_remaps)."""
    m = family.m_column
    cells = {k: v for k, v in family.looked_up(eng.with_env(family, shape, env), gfx).items() if k in shape}
    if m is not None and m in cells and family.padding.startswith("moe"):
        cells[m] = str(m_candidates(family, cells)[0])
    return tuple(sorted(cells.items()))
