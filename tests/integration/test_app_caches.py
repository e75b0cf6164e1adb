"""Each app keeps its own caches (app/services/caches.py), as each process does: two apps over one database in one
process (a restart, a replica) share nothing, and the services reach their app's through the session or Plain."""

from __future__ import annotations

from fastapi.testclient import TestClient

from app.main import create_app
from app.services.caches import caches_of
from tests.conftest import DIGEST, capture
from tests.integration.test_leasing_api import lease


def test_two_apps_over_one_database_keep_their_own_caches(settings) -> None:  # type: ignore[no-untyped-def]
    with TestClient(create_app(settings)) as one, TestClient(create_app(settings)) as two:
        first, second = one.app.state.caches, two.app.state.caches
        assert first is not second
        with one.app.state.db.session(write=False) as s, two.app.state.db.plain(write=False) as p:
            assert caches_of(s) is first and caches_of(p) is second and caches_of(two.app.state.db) is second
        cid = capture(one, [{"M": 1, "N": 1280, "K": 8192}]).json()["campaign_id"]
        assert one.get(f"/v1/campaigns/{cid}/engagement").status_code == 200  # builds the overlay, in one's
        assert len(first.built) == 1 and len(second.built) == 0
        assert lease(two).status_code == 200  # reads the headers and sweeps: two's
        assert any(k[1] == DIGEST for k in second.headers._d) and not first.last_sweep
        assert second.last_sweep
