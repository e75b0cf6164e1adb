"""A campaign page costs one pass over its shapes: the summary's counts and the totals' version share one index
read (campaigns.shape_counts), and the GPU time spent, "default is best" and the cost estimate read the
campaign's results from its leases, not by probing results once per shape. Counted in SQLite's virtual machine
steps (deterministic, unlike a clock) at two sizes of one campaign: what the page adds per shape must be about
what one pass adds."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from tests.conftest import capture
from tests.integration.test_leasing_api import lease, ok_row, plausible_us


@pytest.fixture
def sqlite_client(tmp_path):
    from fastapi.testclient import TestClient

    from app.config import Settings
    from app.main import create_app
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'tuner.db'}", auth=False, max_capture_shapes=10_000)
    with TestClient(create_app(settings)) as c:
        yield c


class Steps:
    """SQLite VM steps run by the app's read connections (a hundred at a time) while counting."""

    def __init__(self, engine) -> None:  # type: ignore[no-untyped-def]
        self.n, self.on = 0, False

        def tick() -> int:
            self.n += self.on
            return 0
        event.listen(engine, "before_cursor_execute",
                     lambda conn, *a: conn.connection.driver_connection.set_progress_handler(tick, 100))

    def __call__(self, work) -> int:  # type: ignore[no-untyped-def]
        self.n, self.on = 0, True
        try:
            work()
        finally:
            self.on = False
        return self.n


def shapes(first: int, n: int) -> list[dict]:
    return [{"M": m, "N": 64, "K": 64, "count": 1 + m % 5} for m in range(first, first + n)]


def test_a_campaign_page_reads_its_shapes_once(sqlite_client, monkeypatch):
    from app.services import campaigns, page_totals

    c = sqlite_client
    db = c.app.state.db
    monkeypatch.setattr(page_totals, "INLINE_MAX", 100)  # the page checks its own shapes only, at both sizes
    monkeypatch.setattr(c.app.state.caches.totals, "_start", lambda *a: None)  # and no background count runs meanwhile
    cid = capture(c, shapes(1, 1500)).json()["campaign_id"]
    body = lease(c, max_shapes=4, budget_s=1000).json()  # results to find: some race time, a cost measured
    for item in body["shapes"]:
        assert c.post(f"/v1/leases/{body['lease_id']}/results",
                      json=ok_row(body, item, plausible_us(body, item, 2.0))).status_code == 200
    steps = Steps(db.read_engine)

    def scan() -> None:
        with db.session(write=False) as s:
            campaigns.shape_counts(s, cid)

    def page() -> None:
        assert c.get(f"/campaigns/{cid}").status_code == 200

    page()  # caches filled (the overlay, the cost estimate) as on any later view
    small = (steps(page), steps(scan))
    capture(c, shapes(5000, 3000))
    page()
    large = (steps(page), steps(scan))
    per_pass = large[1] - small[1]
    assert per_pass > 100  # 3000 more shapes are read: the measure sees them
    # two passes (the summary's and the version's apart) add 2x; a join probing results per shape 1.2x or more
    assert large[0] - small[0] < 1.1 * per_pass, (small, large)


def test_a_campaigns_results_are_its_own(client):
    """GPU time spent, "default is best" and the cost estimate of each campaign count its own results only
    (read from its leases), as they are over its shapes."""
    from sqlalchemy import func, select

    from app.db.models import CampaignShape, Result

    a = capture(client, shapes(1, 6)).json()["campaign_id"]
    b = capture(client, shapes(1, 6), gfx="gfx950", cu_num=256).json()["campaign_id"]
    for gfx, cu, us, elapsed in (("gfx942", 304, 2.0, 3.0), ("gfx950", 256, 5.0, 7.0)):
        body = lease(client, max_shapes=3, budget_s=1000, gfx=gfx, cu_num=cu).json()
        first, *rest = body["shapes"]
        posts = [{"shape_id": first["shape_id"], "backend": "torch", "status": "default_best", "us": 10.0,
                  "default_us": 10.0, "err_ratio": 0.0, "kernel_name": "torch_linear", "elapsed_s": elapsed,
                  "candidates": [{"name": "torch_linear", "us": 10.0}]}]
        posts += [dict(ok_row(body, item, plausible_us(body, item, us)), elapsed_s=elapsed) for item in rest]
        for p in posts:
            assert client.post(f"/v1/leases/{body['lease_id']}/results", json=p).status_code == 200
    db = client.app.state.db
    with db.session(write=False) as s:
        for cid in (a, b):
            got = client.get(f"/v1/campaigns/{cid}").json()
            of_shapes = select(Result).join(CampaignShape, CampaignShape.id == Result.shape_id).where(
                CampaignShape.campaign_id == cid)
            mine = list(s.scalars(of_shapes))
            assert got["gpu_s_spent"] == sum(r.elapsed_s for r in mine) > 0
            assert got["default_best"] == sum(r.status == "default_best" for r in mine) == 1
            assert got["est_shape_cost_s"] == s.scalar(select(func.avg(Result.elapsed_s)).where(
                Result.id.in_([r.id for r in mine])))  # one backend, one elapsed each: the median is theirs
    assert client.get(f"/v1/campaigns/{a}").json()["gpu_s_spent"] != client.get(
        f"/v1/campaigns/{b}").json()["gpu_s_spent"]


def test_a_served_apps_first_request_builds_no_routes(settings, monkeypatch):
    """ready_to_serve (app/cli.py serve runs it) builds every router's request handling before the first
    request: FastAPI builds an included router's the first time a request walks it, and a campaign page, on
    the last router, walked them all (80-260 ms of a server's first page on the 2-core VM). It also freezes
    what start-up made, so a full collection inside a request no longer walks it."""
    import gc

    from fastapi import routing
    from fastapi.testclient import TestClient

    from app.main import create_app, ready_to_serve
    context = getattr(routing, "_EffectiveRouteContext", None)
    if context is None:
        pytest.skip(f"!!! this FastAPI builds routes when they are included, not on a first request: nothing to "
                    f"build ahead")
    built: list[str] = []
    real = context.from_api_route.__func__
    monkeypatch.setattr(context, "from_api_route", classmethod(
        lambda cls, **kw: built.append(kw["original_route"].path) or real(cls, **kw)))
    app = create_app(settings)
    try:
        ready_to_serve(app).join(60)
        assert built and gc.get_freeze_count() > 0
        ahead = len(built)
        with TestClient(app) as c:
            assert c.get("/campaigns/1").status_code == 404  # the last router: every one walked
            assert c.get("/v1/campaigns").status_code == 200
        assert built[ahead:] == []
    finally:
        gc.unfreeze()


def test_after_a_restart_the_newest_campaign_pages_are_made_before_their_first_view(client, settings):
    """ready_to_serve makes the newest campaigns' pages once in a thread (web.warm_pages): their overlay is
    built and the page's statements compiled, so the first view after a restart builds and compiles nothing."""
    import gc

    from fastapi.testclient import TestClient

    from app.main import create_app, ready_to_serve

    cid = capture(client, shapes(1, 30)).json()["campaign_id"]
    app = create_app(settings)  # the restart: a new process's database and caches (app.state.caches)
    try:
        ready_to_serve(app).join(60)
    finally:
        gc.unfreeze()
    assert not app.state.caches.totals._running  # no count started by the warming
    engine, overlays_built = app.state.db.read_engine, app.state.caches.built
    built, compiled = overlays_built.builds, len(engine._compiled_cache)
    assert len(overlays_built) == 1 and compiled > 0
    with TestClient(app) as c:
        assert c.get(f"/campaigns/{cid}").status_code == 200
    assert (overlays_built.builds, len(engine._compiled_cache)) == (built, compiled)
