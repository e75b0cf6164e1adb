"""The campaign page's engagement summary: the prediction on the plan's first offered form beside the latest proof,
per listed shape and in total, and the page's tag read without checking a shape (app/web/routes.py). The verdicts
and their totals are the engagement report's (app/services/engagement.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from sqlalchemy.orm import Session

from app.db.session import Database
from app.services import campaigns, engagement


class _Listed(NamedTuple):
    id: int
    shape: dict
    priority: float
    state: str


def page_summary(s: Session, campaign_id: int, listed: list[dict], db: Database | None = None,
                 counts: dict[str, campaigns.StateCounts] | None = None) -> tuple[dict, Callable[[], None] | None]:
    """For the campaign page: the prediction on the plan's first offered form beside the latest proof in the
    image, with each listed shape's pair (predicted hit, proved hit or None) by shape id. listed: the page's
    shapes (campaigns.shapes rows); the totals over every shape (predicted hits, disagreements with the proof)
    are the engagement report's on that form (_every_or_page: None while counted, with their age once stale);
    counts: the campaign's campaigns.shape_counts, which the page's summary read. Returns the summary and what
    starts a due count (run it after the page is sent)."""
    rows = [_Listed(x["shape_id"], x["shape"], x["served"], x["state"]) for x in listed]
    v, proof, shown, n = engagement._every_or_page(s, db, campaign_id, rows, counts=counts)
    proved = {r["shape_id"]: r for r in proof.results} if proof is not None else {}
    # (predicted hit, proved verdict or None, predicted verdict, the proof disagrees)
    by_shape = {x.id: (c.hit, engagement.proved_verdict(proved[x.id]) if x.id in proved else None, c.verdict,
                       proof is not None and engagement.disagrees(c, proved.get(x.id), proof, v.refused))
                for x, c in zip(v.shapes, v.checks)}
    t = shown.totals or {"hits": None, "disagreements": None}
    return {"form": v.used, "release": v.ov.release.name, "refused": v.refused, "shapes": n,
            "predicted_hits": t["hits"], "predicted_raises": t.get("raises"),
            "predicted_unknown": t.get("unknown"), "stale_s": shown.stale_s,
            "by_shape": by_shape,
            "proof": None if proof is None else {
                "aiter_commit": proof.aiter_commit, "aiter_version": proof.aiter_version, "error": proof.error,
                "created_at": proof.created_at.isoformat(), "worker_id": proof.worker_id,
                "hits": sum(1 for r in proved.values() if r["hit"]),
                "raises": sum(1 for r in proved.values() if r.get("raised")), "probed": len(proved),
                "disagreements": t["disagreements"]}}, shown.start


class PageVersion(NamedTuple):
    """What page_summary shows, known without checking a shape (page_version)."""
    version: tuple  # the form and everything that decides the verdicts and the totals (_version)
    totals: dict | None  # a large campaign's totals as shown (None: counting, or a small campaign's: from version)
    stale_s: float | None  # the shown totals are of an older version, counted that long ago
    start: Callable[[], None] | None  # starts a due count of the totals (page_summary's)


def page_version(s: Session, db: Database | None, campaign_id: int,
                 counts: dict[str, campaigns.StateCounts]) -> PageVersion:
    """What page_summary shows, read without checking a shape (the campaign page's tag, app/web/routes.py): a
    listed shape's verdict follows from the rules and the shape itself, the proof's from the proof; a small
    campaign's totals from the rules, its shapes and the proof; a large one's are page_totals' count as shown.
    counts: the campaign's campaigns.shape_counts."""
    shapes = engagement.shapes_version(counts)
    v = engagement.verdicts(s, campaign_id, only=[])
    proof = engagement.latest_proof(s, campaign_id, v.used)
    version = (v.used, engagement._version(v, shapes, proof))
    if engagement._inline(db, shapes):
        return PageVersion(version, None, None, None)
    assert db is not None
    shown = engagement._counted(db, v, shapes, proof)
    return PageVersion(version, shown.totals, shown.stale_s, shown.start)
