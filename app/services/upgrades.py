"""Image upgrades: a new image inherits its parent's campaigns (shapes, calls, served steps) and, row by row, its
tuning (app/domain/upgrade.py): carried rows are served at once and confirmed by short races, rows the new image
ships or can no longer run are raced again. One transaction: an inherit that fails leaves nothing behind."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from app.db import dialect
from app.db.models import Campaign, CampaignShape, Image, Lease, Result, utcnow
from app.domain import deploy, served
from app.domain import upgrade as up
from app.domain.families import TableFamily, get_family
from app.domain import lease_states as ls
from app.domain.lease_states import ShapeState
from app.domain.tables import Table
from app.errors import Conflict, Invalid, NotFound
from app.services.captures import reweigh
from app.services.lookups import ensure_campaign, ensure_image
from app.services.leasing import set_shape, shape_facts
from app.services.image_tables import release_of, schema_for, shipped_for


def _parents(s: Session) -> dict[str, str | None]:
    return dict(s.execute(select(Image.digest, Image.parent_digest)).all())


def _best_results(s: Session, shape_ids: list[int]) -> dict[int, Result]:
    """Each shape's fastest verified result."""
    best: dict[int, Result] = {}
    for i in range(0, len(shape_ids), 500):
        for r in s.scalars(select(Result).where(Result.shape_id.in_(shape_ids[i:i + 500]),
                                                Result.verified.is_(True))):
            if r.us is not None and (r.shape_id not in best or r.us < (best[r.shape_id].us or float("inf"))):
                best[r.shape_id] = r
    return best


def _default_best(s: Session, shape_ids: list[int]) -> dict[int, Result]:
    """Each shape's latest "default is best" result, for shapes tuned so (a verified row, if any, wins over it)."""
    out: dict[int, Result] = {}
    for i in range(0, len(shape_ids), 500):
        for r in s.scalars(select(Result).where(Result.shape_id.in_(shape_ids[i:i + 500]),
                                                Result.status == ls.ResultKind.DEFAULT_BEST.value)
                           .order_by(Result.id)):
            out[r.shape_id] = r
    return out


def _default_name(res: Result) -> str | None:
    """The default path's name in a race: the candidate timed at the result's default_us (leasing requires one)."""
    for c in res.candidates or []:
        if c.get("name") and c.get("us") is not None and res.default_us is not None \
                and abs(float(c["us"]) - res.default_us) <= 1e-6 * max(1.0, res.default_us):
            return str(c["name"])
    return None


def _triage(s: Session, camp: Campaign, shapes: list[CampaignShape], carried: dict[int, Result]) -> None:
    """Each shape's verdict against its image's tables and kernel catalog as known now (shapes: those with a
    carried result, by shape id)."""
    if not shapes:
        return
    fam = get_family(camp.family)
    img = s.get(Image, camp.image_digest)
    catalog = (img.kernel_catalog or {}).get(fam.name) if img else None
    schema = schema_for(s, camp.image_digest, fam.name)
    release = release_of(s, camp.image_digest)
    # a "default is best" result has no row: its shape's key cells stand for it (a key the image ships now)
    rows = [carried[sh.id].row or dict(sh.shape, gfx=camp.gfx, cu_num=str(camp.cu_num)) for sh in shapes]
    shipped = deploy.shipped_rows(release, fam, shipped_for(s, camp.image_digest, fam.name, release),
                                  Table(tuple(schema.header), [{c: r.get(c, "") for c in schema.header} for r in rows]),
                                  camp.gfx)
    for sh, row, ship in zip(shapes, rows, shipped):
        _triage_one(sh, carried[sh.id], row, ship, fam, catalog, schema.header)


def _triage_one(sh: CampaignShape, res: Result, row: dict[str, str], ship: dict[str, str] | None, fam: TableFamily,
                catalog: Collection[str] | None, header: Iterable[str]) -> None:
    """One carried shape's verdict (_triage): its kernel as the new image names it, raced against what it ships."""
    # the kernel under the name the new image gives it (AITER renames kernels between releases without
    # changing them: TableFamily.kernel_renames), so a renamed kernel is carried, not raced again
    default_best = not res.verified and res.status == ls.ResultKind.DEFAULT_BEST.value
    kernel = fam.catalog_name((_default_name(res) if default_best else res.kernel_name) or fam.kernel_of(row),
                              catalog, row)
    cands = [dict(c, name=fam.catalog_name(str(c["name"]), catalog, row)) if c.get("name") else c
             for c in res.candidates or []]
    verdict = up.triage(kernel, row, header, ship is not None, catalog, default_best)
    sh.triage, sh.outcome = verdict.value, None
    if verdict in (up.Triage.CARRIED, up.Triage.DEFAULT_BEST):
        sh.finalists = up.finalists(kernel, cands, catalog=catalog)
    elif verdict is up.Triage.NOW_SHIPPED:
        theirs = fam.kernel_of(ship or {})
        if theirs and theirs in fam.kernel_forms(kernel, row):
            kernel = theirs
        settled = up.settled(verdict, kernel, theirs)
        if settled is not None:  # the image ships our very row's kernel: covered by it, nothing to race
            sh.outcome, sh.finalists = settled.value, None
            set_shape(sh, ls.cover(shape_facts(sh), f"the image ships this key with {theirs}, the kernel "
                                                     f"{res.image_digest[:19]} tuned: nothing to race"))
            return
        # the shipped kernel is the incumbent to beat; ours and the parent's best race it
        sh.finalists = ([theirs] if theirs else []) + [k for k in up.finalists(
            kernel, cands, catalog=catalog) if k != theirs]
    else:
        sh.finalists = None


def inherit(s: Session, new: str, old: str) -> dict[str, Any]:
    """new's campaigns from old's (every gfx/cu_num/family), with their shapes, calls and served-step histograms,
    and each verified row triaged. Refused (nothing written) for an unknown parent, a cycle, or a second parent.

    Safe beside other replicas: the lineage is read and changed under one lock (two inherits never make a cycle or
    give an image two parents; the loser answers 409), shapes captures insert meanwhile are merged into, and the
    new image's shapes are read with their row locks, so a shape a worker leased or tuned meanwhile keeps its own
    race (lease_states.carry)."""
    if s.get(Image, old) is None:
        raise NotFound(f"from: no image {old} is known here", "from")
    dialect.lineage_lock(s)
    try:
        up.check_lineage(new, old, _parents(s))
    except up.LineageError as e:
        raise (Conflict if e.conflict else Invalid)(str(e), e.field) from None
    ensure_image(s, new)
    s.flush()
    # the database's own guard: an image takes its one parent only while it has none
    took: Any = s.execute(update(Image).where(Image.digest == new, Image.parent_digest.is_(None))
                          .values(parent_digest=old).execution_options(synchronize_session="fetch"))
    if took.rowcount != 1:
        raise Conflict(f"image_digest: {new} already inherits from another image", "image_digest")
    now = utcnow()
    out = [_inherit_campaign(s, new, oc, now) for oc in s.scalars(
        select(Campaign).where(Campaign.image_digest == old).order_by(Campaign.id)).all()]
    if not out:
        raise Invalid(f"from: image {old} has no campaigns to inherit", "from")
    return {"image_digest": new, "from": old, "campaigns": out}


def _inherit_campaign(s: Session, new: str, oc: Campaign, now: datetime) -> dict[str, Any]:
    """One of the parent's campaigns into new's (inherit): its shapes inserted or merged, its rows triaged."""
    nc = ensure_campaign(s, new, oc.gfx, oc.cu_num, oc.family)
    s.flush()
    if oc.step_hist:
        nc.step_hist = served.merge(nc.step_hist, oc.step_hist)
    if oc.length_hist:
        nc.length_hist = served.merge_lengths(nc.length_hist, oc.length_hist)
    olds = s.scalars(select(CampaignShape).where(CampaignShape.campaign_id == oc.id)
                     .order_by(CampaignShape.id)).all()
    # insert-or-merge: a capture for the new image may insert the same keys at this very moment
    inserted = dialect.insert_shapes_absent(s, [dict(
        campaign_id=nc.id, shape_key=o.shape_key, shape=o.shape, calls=o.calls, flops=o.flops,
        default_us=o.default_us, default_measured=o.default_measured, steps=o.steps, priority=o.priority,
        state=ShapeState.QUEUED.value, attempts=0, attempts_base=0, updated_at=now) for o in olds])
    # row locks in key order (as captures take theirs): a lease picks past them (SKIP LOCKED), one that
    # picked first is waited for and then seen leased
    have = {sh.shape_key: sh for sh in s.scalars(
        select(CampaignShape).where(CampaignShape.campaign_id == nc.id)
        .order_by(CampaignShape.shape_key).with_for_update()
        .execution_options(populate_existing=True))}
    best = _best_results(s, [sh.id for sh in olds])
    best = {**_default_best(s, [sh.id for sh in olds if sh.id not in best]), **best}
    to_triage = _to_triage(olds, have, inserted, best)
    carried: dict[int, Result] = {}
    for sh, res in to_triage:
        sh.carried_result_id = res.id
        carried[sh.id] = res
    _triage(s, nc, [sh for sh, _ in to_triage], carried)
    if nc.step_hist:
        s.flush()
        reweigh(s, nc, get_family(nc.family))
    verdicts = Counter(sh.triage for sh, _ in to_triage)
    return {"campaign_id": nc.id, "from_campaign_id": oc.id, "family": nc.family, "gfx": nc.gfx,
            "cu_num": nc.cu_num, "shapes_added": len(inserted), "with_row": len(to_triage),
            **{v.value: verdicts.get(v.value, 0) for v in up.Triage}}


def _to_triage(olds: Sequence[CampaignShape], have: dict[str, CampaignShape], inserted: Collection[str],
               best: dict[int, Result]) -> list[tuple[CampaignShape, Result]]:
    """The new image's shapes that take their parent shape's best result to triage; a shape the new image already
    works on (or tuned, or triaged) keeps its own race. Calls merge as the larger count."""
    to_triage = []
    for o in olds:
        sh = have.get(o.shape_key)
        if sh is None:
            continue
        try:
            ls.carry(shape_facts(sh))
        except ls.TransitionError:
            continue  # the new image already works on it (or tuned it): its own race stands
        if sh.triage:
            continue
        if o.shape_key not in inserted:
            sh.calls = max(sh.calls, o.calls)
        if o.id in best:
            to_triage.append((sh, best[o.id]))
    return to_triage


def retriage(s: Session, digest: str) -> int:
    """The image's tables or kernel catalog changed (its worker reported them): inherited rows nobody has raced here
    yet are triaged again against what the image has now, whichever way it went (a key it now ships, a kernel it
    lacks, or, a catalog restored, a kernel it has again: the row is carried once more). A shape being raced or
    decided stays as it is."""
    s.flush()
    n = 0
    for camp in s.scalars(select(Campaign).where(Campaign.image_digest == digest)).all():
        shapes = s.scalars(select(CampaignShape).where(
            CampaignShape.campaign_id == camp.id, CampaignShape.triage.is_not(None),
            CampaignShape.carried_result_id.is_not(None), CampaignShape.outcome.is_(None),
            CampaignShape.state == ShapeState.QUEUED.value)
            .order_by(CampaignShape.shape_key).with_for_update(skip_locked=True)).all()
        if not shapes:
            continue
        results = {r.id: r for r in s.scalars(select(Result).where(
            Result.id.in_([sh.carried_result_id for sh in shapes])))}
        carried = {sh.id: results[sh.carried_result_id] for sh in shapes if sh.carried_result_id in results}
        _triage(s, camp, [sh for sh in shapes if sh.id in carried], carried)
        n += len(carried)
    return n


def counts(s: Session, campaign_id: int, may_see: Any = lambda d: True) -> dict[str, Any] | None:
    """What an inherited campaign carried and how its confirmations went, with its race time against the parent
    campaign's (None: the campaign's image inherits nothing). may_see: the digests the reader's token may learn;
    the parent's digest and campaign are left out for one scoped to the child only (as lineage leaves them)."""
    camp = s.get(Campaign, campaign_id)
    img = s.get(Image, camp.image_digest) if camp else None
    if camp is None or img is None or not img.parent_digest:
        return None
    parent = s.scalars(select(Campaign).where(Campaign.image_digest == img.parent_digest, Campaign.gfx == camp.gfx,
                                              Campaign.cu_num == camp.cu_num, Campaign.family == camp.family)).first()
    by = Counter({(t, o): n for t, o, n in s.execute(
        select(CampaignShape.triage, CampaignShape.outcome, func.count()).where(
            CampaignShape.campaign_id == campaign_id, CampaignShape.triage.is_not(None))
        .group_by(CampaignShape.triage, CampaignShape.outcome))})

    def n(triage: str | None = None, outcome: str | None = None) -> int:
        return sum(v for (t, o), v in by.items()
                   if (triage is None or t == triage) and (outcome is None or o == outcome))

    def spent(cid: int) -> float:
        return float(s.scalar(select(func.sum(Result.elapsed_s)).join(Lease, Lease.id == Result.lease_id)
                              .where(Lease.campaign_id == cid)) or 0.0)
    gpu, parent_gpu = spent(campaign_id), spent(parent.id) if parent else 0.0
    shown = may_see(img.parent_digest)
    return {"from_digest": img.parent_digest if shown else None,
            "from_campaign_id": parent.id if parent and shown else None,
            "inherited_rows": n(),
            "carried": n(up.Triage.CARRIED), "provisional": n(up.Triage.CARRIED) - sum(
                n(up.Triage.CARRIED, o) for o in up.Outcome),
            "confirmed": n(outcome=up.Outcome.CONFIRMED), "overturned": n(outcome=up.Outcome.OVERTURNED),
            "re_raced": n(outcome=up.Outcome.RE_RACED),
            "kernel_gone": n(up.Triage.KERNEL_GONE), "header_changed": n(up.Triage.HEADER_CHANGED),
            "now_shipped": n(up.Triage.NOW_SHIPPED), "default_best": n(up.Triage.DEFAULT_BEST), "shipped_kept": n(outcome=up.Outcome.SHIPPED_KEPT),
            "ours_kept": n(outcome=up.Outcome.OURS_KEPT),
            "gpu_s": gpu, "parent_gpu_s": parent_gpu, "gpu_ratio": gpu / parent_gpu if parent_gpu else None}
