"""Databases written by earlier versions, with their own code (tests/fixtures/old_dbs/make.py, run in a checkout of
each commit below), upgrade to head and read through today's services as the old version showed them: campaigns and
their shapes' states, calls and results, the overlay of the verified rows, an image's lineage and what it carried,
and a lease that was live when the old service stopped (swept now, its shapes raced again).

rev0005: 0d86cfb, before 0006 (its backfill of each shape's estimated default time runs here on real rows);
rev0010: 9b73c79; rev0015: cb1baca (image lineage: the second image inherited the first)."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from app.config import Settings
from app.db import migrate
from app.db.models import CampaignShape, Lease, utcnow
from app.db.session import Database
from app.services import campaigns, leasing, lineage, overlays, upgrades
from app.wire import LeaseIn
from tests.conftest import DIGEST, ROOT

OLD = ROOT / "tests" / "fixtures" / "old_dbs"
HEAD = sorted(p.name[:4] for p in (ROOT / "app" / "migrations" / "versions").glob("0*.py"))[-1]


@pytest.fixture(params=["0005", "0010", "0015"])
def old(request, tmp_path: Path):  # type: ignore[no-untyped-def]
    rev = request.param
    path = tmp_path / f"rev{rev}.sqlite"
    shutil.copy(OLD / f"rev{rev}.sqlite", path)  # the fixture itself stays as the old version wrote it
    url = f"sqlite:///{path}"
    applied = migrate.upgrade(url)
    assert applied[0] == f"{int(rev) + 1:04d}" and applied[-1] == HEAD  # every later revision ran, from its own
    db = Database(url)
    yield db, Settings(database_url=url, lease_ttl_s=30, lease_grace_s=5, max_attempts=3, auth=False), \
        json.loads((OLD / f"rev{rev}.json").read_text())
    db.dispose()


def test_campaigns_shapes_and_overlays_read_as_the_old_version_showed_them(old) -> None:  # type: ignore[no-untyped-def]
    db, settings, facts = old
    with db.session(write=False) as s:
        summaries = {str(c["campaign_id"]): c for c in campaigns.summaries(s, settings.default_shape_cost_s)}
        for cid, f in facts["campaigns"].items():
            summary = summaries[cid]
            assert (summary["image_digest"], summary["family"], summary["gfx"], summary["cu_num"]) == (
                f["image_digest"], f["family"], f["gfx"], f["cu_num"])
            assert summary["tuned"] == f["tuned"]
            listed, _ = campaigns.shapes(s, int(cid), limit=100)
            assert {str(x["shape_id"]): [x["state"], x["calls"], x["us"]] for x in listed} == f["shapes_seen"]
            # every shape has its estimated default time and is served by it: 0006's backfill (rev0005) or the
            # capture that made it
            assert all(x["default_us_est"] > 0 and x["served"] == pytest.approx(x["calls"] * x["default_us_est"])
                       for x in listed)
        ov = overlays.build(s, DIGEST, "bf16_gemm", "gfx942")
        assert len(ov.table.rows) == facts["overlay_rows"] == 3
        if facts["inherited"]:
            new = facts["inherited"]["digest"]
            assert lineage.lineage(s, new)["parent"] == DIGEST
            for carried in facts["inherited"]["campaigns"]:
                counts = upgrades.counts(s, carried["campaign_id"])
                assert counts is not None and counts["carried"] == carried["carried"]


def test_a_lease_live_when_the_old_service_stopped_is_swept_and_its_shapes_raced_again(old) -> None:  # type: ignore[no-untyped-def]
    db, settings, facts = old
    live = facts["live_lease"]

    def held() -> list[tuple[int, str, int]]:
        with db.session(write=False) as s:
            return sorted((sh.id, sh.state, sh.attempts) for sh in s.scalars(
                select(CampaignShape).where(CampaignShape.id.in_(live["shape_ids"]))))
    before = held()
    assert [(i, st) for i, st, _ in before] == [(i, "leased") for i in live["shape_ids"]]
    with db.plain() as p:  # a day on: long past the old lease's expiry, whenever this runs
        assert p.drive(leasing.sweep_expired(p, settings, now=utcnow() + timedelta(days=1))) == 1
    with db.session(write=False) as s:
        assert s.get(Lease, live["lease_id"]).state == "expired"
    assert held() == [(i, "queued", n + 1) for i, _, n in before]  # each counted the try the dead worker had
    with db.plain() as p:
        out = p.drive(leasing.lease_batch(p, LeaseIn(worker_id="after-upgrade", image_digest=DIGEST, gfx="gfx942",
                                                     cu_num=304, backends=["torch"], budget_s=80_000), settings))
    assert out is not None and out.campaign_id == live["campaign_id"]
    assert set(live["shape_ids"]) <= {x.shape_id for x in out.shapes}
