"""Ingest a capture: parse, validate everything first, then add counts to the campaign's shapes."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.schemas import CaptureIn, CaptureOut
from app.db.dialect import add_shape_calls
from app.db.models import Campaign, CampaignShape, Capture, utcnow
from app.domain import capture_parsing, served
from app.domain.families import TableFamily
from app.domain.roofline import estimate_us
from app.domain.shapes import ShapeError, flops
from app.errors import Invalid
from app.services.lineage import suggestion_note
from app.services.lookups import ensure_campaign, ensure_image, family_or_422


def parse(body: CaptureIn, limit: int = capture_parsing.MAX_SHAPES
          ) -> tuple[TableFamily, str, capture_parsing.ParsedCapture]:
    fam = family_or_422(body.family)
    given = [k for k in ("shapes", "untuned_csv", "log") if getattr(body, k) is not None]
    if len(given) != 1:
        raise Invalid("shapes: give exactly one of shapes (JSON), untuned_csv or log", "shapes")
    fmt = given[0]
    try:
        if fmt == "shapes" and not body.shapes and body.step_buckets:
            parsed = capture_parsing.ParsedCapture()  # a metrics-only update
        elif fmt == "shapes":
            parsed = capture_parsing.from_json(fam, body.shapes or [], limit)
        elif fmt == "untuned_csv":
            parsed = capture_parsing.from_untuned_csv(fam, body.untuned_csv or "", limit)
        else:
            parsed = capture_parsing.from_log(fam, body.log or "", body.gfx, body.cu_num, limit, env=body.env)
    except ShapeError as e:
        raise Invalid(str(e), e.field) from None
    return fam, fmt, parsed


def _step_delta(body: CaptureIn) -> dict[str, float] | None:
    if not body.step_buckets:
        return None
    try:
        return served.merge(None, body.step_buckets)
    except served.HistogramError as e:
        raise Invalid(f"step_buckets: {e}", "step_buckets") from None


def _length_delta(body: CaptureIn) -> dict[str, dict[str, float]] | None:
    if not body.length_buckets:
        return None
    try:
        return served.merge_lengths(None, {str(k): v for k, v in body.length_buckets.items()})
    except served.HistogramError as e:
        raise Invalid(f"length_buckets: {e}", "length_buckets") from None


def _already(s: Session, digest: str, uid: str | None, fam: TableFamily) -> CaptureOut | None:
    """This image's capture with this uid, if counted already (another image's uid is another capture)."""
    prior = s.scalars(select(Capture).where(Capture.image_digest == digest, Capture.capture_uid == uid)).first() \
        if uid else None
    if prior is None:
        return None
    camp = s.get(Campaign, prior.campaign_id)
    return CaptureOut(capture_id=prior.id, campaign_id=prior.campaign_id, family=fam.name,
                      shapes_received=prior.shapes, shapes_new=0, calls_added=0, duplicate=True,
                      notes=["capture_uid already counted; nothing added"],
                      priority_rule=served.rule(camp.step_hist if camp else None))


def reweigh(s: Session, camp: Campaign, fam: TableFamily) -> None:
    """Served steps and priority of every shape of the campaign, from its step histogram."""
    rows = s.execute(select(CampaignShape.id, CampaignShape.shape, CampaignShape.default_us, CampaignShape.state)
                     .where(CampaignShape.campaign_id == camp.id)).all()
    shapes = [r.shape for r in rows]
    weights = served.fold_covered(fam, shapes, served.step_weights(fam, shapes, camp.step_hist or {}),
                                  [r.state == "covered" for r in rows])
    s.execute(update(CampaignShape), [{"id": r.id, "steps": w, "priority": served.priority(0, w, r.default_us)}
                                      for r, w in zip(rows, weights)])


def ingest(s: Session, body: CaptureIn, max_shapes: int = capture_parsing.MAX_SHAPES,
           max_campaign_shapes: int | None = None, may_see: Callable[[str], bool] = lambda d: True) -> CaptureOut:
    """may_see: the digests the caller's token may learn (a note naming another image is left out otherwise)."""
    fam, fmt, parsed = parse(body, max_shapes)  # raises before anything is written
    delta, lengths = _step_delta(body), _length_delta(body)
    done = _already(s, body.image_digest, body.capture_uid, fam)
    if done is not None:
        return done
    # what a server claims about AITER stays on its capture; the image's version is what its workers read there
    ensure_image(s, body.image_digest)
    camp = ensure_campaign(s, body.image_digest, body.gfx, body.cu_num, fam.name)
    cap = Capture(campaign_id=camp.id, image_digest=body.image_digest, host=body.host, source_format=fmt,
                  aiter_version=body.aiter_version, aiter_commit=body.aiter_commit, env=body.env,
                  shapes=len(parsed.shapes), calls=sum(c for _, c in parsed.shapes.values()),
                  capture_uid=body.capture_uid, step_hist=delta)
    try:
        with s.begin_nested():  # a concurrent repeat of this capture_uid: theirs counted, ours is a duplicate
            s.add(cap)
            s.flush()
    except IntegrityError:
        done = _already(s, body.image_digest, body.capture_uid, fam)
        if done is None:
            raise
        return done
    rows = []
    for key, (shape, count) in parsed.shapes.items():
        d = shape.as_dict()
        est = estimate_us(fam, d, body.gfx, body.cu_num)
        rows.append((key, d, count, flops(fam, d), est, served.priority(count, None, est)))
    new = add_shape_calls(s, camp.id, rows, utcnow())
    if new and max_campaign_shapes is not None:  # checked after the insert; raising rolls it all back
        held = s.scalar(select(func.count()).select_from(CampaignShape)
                        .where(CampaignShape.campaign_id == camp.id)) or 0
        if held > max_campaign_shapes:
            raise Invalid(f"shapes: campaign {camp.id} would hold {held} shapes, above the cap of "
                          f"{max_campaign_shapes}; tune or prune it first", "shapes")
    if delta:
        camp.step_hist = served.merge(camp.step_hist, delta)
    if lengths:
        camp.length_hist = served.merge_lengths(camp.length_hist, lengths)
    if camp.step_hist and (delta or rows):
        reweigh(s, camp, fam)
    notes = list(parsed.notes)
    if new:  # new shapes: maybe an image seen for the first time, from a host that ran another one
        note = suggestion_note(s, body.image_digest, may_see)
        if note:
            notes.append(note)
    return CaptureOut(capture_id=cap.id, campaign_id=camp.id, family=fam.name, shapes_received=len(parsed.shapes),
                      shapes_new=new, calls_added=cap.calls, notes=notes,
                      priority_rule=served.rule(camp.step_hist))
