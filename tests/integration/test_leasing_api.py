"""Leasing over HTTP on a real database: identity, sizing, heartbeats, results, expiry, parking."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone

import pytest

from tests.conftest import DIGEST, OTHER_DIGEST, capture


def lease(client, budget_s=60.0, worker="w1", digest=DIGEST, gfx="gfx942", cu_num=304, **kw):
    return client.post("/v1/leases", json={"worker_id": worker, "image_digest": digest, "gfx": gfx,
                                           "cu_num": cu_num, "backends": ["torch"], "budget_s": budget_s, **kw})


def ok_row(lease_body, item, us=10.0, **over):
    row = dict(item["shape"], gfx=lease_body["gfx"], cu_num=lease_body["cu_num"], libtype="torch", solidx=0,
               splitK=0, us=us, kernelName="k", err_ratio=0.0, tflops=1, bw=1)
    row.update(over)
    return {"shape_id": item["shape_id"], "backend": "torch", "status": "ok", "row": row, "us": us,
            "err_ratio": 0.0, "elapsed_s": 2.0}


def plausible_us(body, item, us):
    """At least the roofline floor of the shape on the lease's device (a faster time is refused)."""
    from app.domain.families import get_family
    from app.domain.roofline import floor_us
    return max(us, 1.01 * floor_us(get_family(body["family"]), item["shape"], body["gfx"], body["cu_num"]))


def tune_all(client, gfx="gfx942", cu_num=304, us_of=lambda item: 2.0, **row):
    """Lease and post a verified result for every queued shape of this identity (times raised to plausible)."""
    while (r := lease(client, budget_s=80_000, gfx=gfx, cu_num=cu_num)).status_code == 200:
        body = r.json()
        for item in body["shapes"]:
            us = plausible_us(body, item, us_of(item))
            res = client.post(f"/v1/leases/{body['lease_id']}/results", json=ok_row(body, item, us, **row))
            assert res.status_code == 200, res.text
    assert r.status_code == 204, r.text


def shapes(n, n0=64):
    return [{"M": m, "N": n0, "K": 64} for m in range(1, n + 1)]  # served time grows with M


def test_a_worker_only_gets_its_own_image_gfx_and_cu_num(client):
    capture(client, shapes(2))
    capture(client, shapes(2), gfx="gfx950", cu_num=256)
    capture(client, shapes(2), digest=OTHER_DIGEST)
    assert lease(client, gfx="gfx942", cu_num=80).status_code == 204
    assert lease(client, digest="sha256:" + "ef" * 32).status_code == 204
    r = lease(client, gfx="gfx950", cu_num=256)
    assert r.status_code == 200
    body = r.json()
    assert (body["gfx"], body["cu_num"], body["image_digest"]) == ("gfx950", 256, DIGEST)
    assert len(body["shapes"]) == 2
    assert lease(client, gfx="gfx950", cu_num=256).status_code == 204  # nothing left for that identity


def test_batch_fits_the_budget_from_measured_cost(client, settings):
    capture(client, shapes(20))
    first = lease(client, budget_s=settings.default_shape_cost_s * 3).json()
    assert len(first["shapes"]) == 3 and first["est_shape_cost_s"] == settings.default_shape_cost_s
    for item in first["shapes"]:
        assert client.post(f"/v1/leases/{first['lease_id']}/results", json=ok_row(first, item)).status_code == 200
    second = lease(client, budget_s=10.0).json()  # measured: 2 s a shape
    assert second["est_shape_cost_s"] == 2.0 and len(second["shapes"]) == 5
    # highest served time first, never a shape twice
    ms = [int(x["shape"]["M"]) for x in first["shapes"] + second["shapes"]]
    assert ms == sorted(ms, reverse=True) and len(set(ms)) == len(ms)


def test_results_are_idempotent_and_only_for_the_lease(client):
    capture(client, shapes(3))
    a = lease(client, max_shapes=1, worker="a").json()
    b = lease(client, max_shapes=1, worker="b").json()
    item = a["shapes"][0]
    r1 = client.post(f"/v1/leases/{a['lease_id']}/results", json=ok_row(a, item))
    r2 = client.post(f"/v1/leases/{a['lease_id']}/results", json=ok_row(a, item))
    assert r1.status_code == r2.status_code == 200
    assert r2.json()["duplicate"] and r1.json()["result_id"] == r2.json()["result_id"]
    wrong = client.post(f"/v1/leases/{b['lease_id']}/results", json=ok_row(b, item))
    assert wrong.status_code == 409 and wrong.json()["field"] == "shape_id"
    assert client.post("/v1/leases/00000000-0000-0000-0000-000000000000/results", json=ok_row(a, item)).status_code == 404


def test_a_batch_of_results_is_answered_in_order_each_as_its_own_post_would_be(client):
    capture(client, shapes(4))
    a = lease(client, budget_s=80_000, max_shapes=3, worker="a").json()
    b = lease(client, budget_s=80_000, max_shapes=1, worker="b").json()
    x, y, z = a["shapes"]
    refused = ok_row(a, z, cu_num=80)  # the service's own check (valid on the wire): refused, its try counted
    batch = [ok_row(a, x), ok_row(a, b["shapes"][0]), refused, ok_row(a, y)]
    r = client.post(f"/v1/leases/{a['lease_id']}/results/batch", json={"results": batch})
    assert r.status_code == 200, r.text
    out = r.json()["outcomes"]
    assert [(o["shape_id"], o["status"], o["field"]) for o in out] == [
        (x["shape_id"], 200, None), (b["shapes"][0]["shape_id"], 409, "shape_id"), (z["shape_id"], 422, "row.cu_num"),
        (y["shape_id"], 200, None)]
    assert out[0]["result"]["shape_state"] == "tuned" and not out[0]["result"]["duplicate"]
    again = client.post(f"/v1/leases/{a['lease_id']}/results/batch", json={"results": [ok_row(a, x)]}).json()
    assert again["outcomes"][0]["result"]["duplicate"]  # a retried batch stores nothing twice
    assert again["outcomes"][0]["result"]["result_id"] == out[0]["result"]["result_id"]
    shapes_now = {s["shape_id"]: s for s in client.get(f"/v1/campaigns/{a['campaign_id']}").json()["shape_list"]}
    assert [shapes_now[s["shape_id"]]["state"] for s in (x, y)] == ["tuned", "tuned"]
    assert client.post(f"/v1/leases/{a['lease_id']}/results/batch", json={"results": []}).status_code == 422


def test_a_refused_result_names_the_field_counts_a_try_and_parks_the_shape(client, settings):
    capture(client, shapes(1))
    body = lease(client).json()
    item = body["shapes"][0]
    r = client.post(f"/v1/leases/{body['lease_id']}/results", json=ok_row(body, item, cu_num=80))
    assert r.status_code == 422 and r.json()["field"] == "row.cu_num"
    again = lease(client).json()  # the refused try counted (no give-back loop), so it is attempt 2
    (item,) = again["shapes"]
    assert item["attempts"] == 2
    bad = ok_row(again, item)
    del bad["row"]["kernelName"]
    r = client.post(f"/v1/leases/{again['lease_id']}/results", json=bad)
    assert r.status_code == 422 and r.json()["field"] == "row.kernelName"
    assert lease(client).status_code == 204  # parked after max_attempts (2 here)
    detail = client.get(f"/v1/campaigns/{body['campaign_id']}").json()
    assert (detail["failed"], detail["tuned"]) == (1, 0)
    assert "row.kernelName" in detail["shape_list"][0]["last_error"]


def test_release_counts_a_try_for_a_shape_being_worked_on(client, settings):
    capture(client, shapes(2))
    for _ in range(settings.max_attempts):
        body = lease(client, budget_s=1000).json()
        top = body["shapes"][0]["shape_id"]
        r = client.post(f"/v1/leases/{body['lease_id']}/release", json={"started": [top]})
        assert r.json()["requeued"] == 2
    final = lease(client, budget_s=1000).json()
    assert [x["shape_id"] for x in final["shapes"]] != [top] and top not in [x["shape_id"] for x in final["shapes"]]
    assert final["shapes"][0]["attempts"] == 1  # the untouched one was given back uncounted each time


def test_failures_park_a_shape_after_max_attempts(client, settings):
    capture(client, shapes(1))
    for attempt in range(settings.max_attempts):
        body = lease(client).json()
        item = body["shapes"][0]
        assert item["attempts"] == attempt + 1
        r = client.post(f"/v1/leases/{body['lease_id']}/results", json={
            "shape_id": item["shape_id"], "backend": "torch", "status": "failed", "error": f"boom {attempt}"})
        assert r.json()["shape_state"] == ("failed" if attempt + 1 == settings.max_attempts else "queued")
    assert lease(client).status_code == 204
    (s,) = client.get(f"/v1/campaigns/{body['campaign_id']}").json()["shape_list"]
    assert s["state"] == "failed" and s["last_error"] == f"boom {settings.max_attempts - 1}"


def test_an_unverified_winner_does_not_count_as_tuned(client):
    capture(client, shapes(1))
    body = lease(client).json()
    item = body["shapes"][0]
    res = ok_row(body, item)
    res["err_ratio"] = 0.5
    r = client.post(f"/v1/leases/{body['lease_id']}/results", json=res)
    assert r.json() == {"result_id": r.json()["result_id"], "shape_state": "queued", "verified": False,
                        "duplicate": False}
    assert client.get(f"/v1/overlays/{DIGEST}/bf16_gemm.csv", params={"version": "latest"}).text.count("\n") == 1  # header only


def test_release_requeues_without_counting_an_attempt(client):
    capture(client, shapes(3))
    body = lease(client, budget_s=1000).json()
    client.post(f"/v1/leases/{body['lease_id']}/results", json=ok_row(body, body["shapes"][0]))
    r = client.post(f"/v1/leases/{body['lease_id']}/release")
    assert r.json()["requeued"] == 2
    again = lease(client).json()
    assert len(again["shapes"]) == 2 and all(x["attempts"] == 1 for x in again["shapes"])
    assert client.post(f"/v1/leases/{body['lease_id']}/heartbeat").status_code == 409


def test_a_release_keeps_the_workers_reason_and_refuses_an_overlong_one(client):
    """Issue 50: a worker whose GPU stayed busy hands the lease back saying why; the lease keeps it and the
    workers list counts it. A reason over 500 characters is a 422 naming `reason`, and the lease stays live."""
    capture(client, shapes(2))
    body = lease(client, budget_s=1000).json()
    r = client.post(f"/v1/leases/{body['lease_id']}/release", json={"reason": "x" * 501})
    assert r.status_code == 422 and "reason" in r.text
    assert client.post(f"/v1/leases/{body['lease_id']}/heartbeat").status_code == 200
    r = client.post(f"/v1/leases/{body['lease_id']}/release", json={"reason": "GPU busy: control kernel +16%"})
    assert r.json()["requeued"] == 2
    (w,) = [w for w in client.get("/v1/workers").json() if w["worker_id"] == "w1"]
    assert w["handed_back"] == 1 and w["handed_back_why"] == "GPU busy: control kernel +16%"


def test_expired_lease_gives_its_shapes_back(client, settings):
    settings.lease_ttl_s = 0.5
    capture(client, shapes(2))
    body = lease(client, worker="dead").json()
    client.post(f"/v1/leases/{body['lease_id']}/results", json=ok_row(body, body["shapes"][0]))
    time.sleep(0.8)
    assert client.post(f"/v1/leases/{body['lease_id']}/heartbeat").status_code == 409
    # only the dead lease expires: "alive"'s lives past this test however slow its requests (at 0.5 s a sweep
    # could end it before the checks below), and its request still sweeps (no 1 s throttle since the last one)
    settings.lease_ttl_s = 30
    client.app.state.caches.last_sweep.clear()  # this app's (app/services/caches.py)
    again = lease(client, worker="alive").json()
    assert [x["shape_id"] for x in again["shapes"]] == [body["shapes"][1]["shape_id"]]
    assert again["shapes"][0]["attempts"] == 2
    late = client.post(f"/v1/leases/{body['lease_id']}/results", json=ok_row(body, body["shapes"][1]))
    assert late.status_code == 409  # the dead worker's late post cannot land on a re-leased shape
    c = client.get(f"/v1/campaigns/{body['campaign_id']}").json()
    assert (c["tuned"], c["leased"]) == (1, 1)
    by_id = {x["shape_id"]: x for x in c["shape_list"]}
    assert by_id[body["shapes"][1]["shape_id"]]["us"] is None  # the record is not the shape's result
    # ... but the finished measurement is kept, as a record only: nothing a worker finished is lost
    from sqlalchemy import create_engine, text
    eng = create_engine(settings.database_url.replace("postgresql://", "postgresql+psycopg://"))
    with eng.connect() as conn:
        kept = conn.execute(text("SELECT status, verified FROM results WHERE lease_id = :l AND shape_id = :s"),
                            {"l": body["lease_id"], "s": body["shapes"][1]["shape_id"]}).all()
    eng.dispose()
    assert [(st, bool(v)) for st, v in kept] == [("superseded", False)] and "kept as a record" in late.text


def _sleep_until(t: datetime) -> None:
    time.sleep(max(0.0, (t - datetime.now(timezone.utc)).total_seconds()))


def test_heartbeat_extends_but_never_past_budget_and_grace(client, settings):
    """Each step waits for a moment the lease's own times name, with seconds to spare either side, so a loaded
    machine's slow request still lands in the window meant (a 1 s TTL left a request 0.2 s of slack)."""
    settings.lease_ttl_s, settings.lease_grace_s = 3.0, 1.0
    capture(client, shapes(1))
    body = lease(client, budget_s=3.0).json()  # hard deadline: lease + 4 s
    hard, first = datetime.fromisoformat(body["hard_deadline"]), datetime.fromisoformat(body["expires_at"])
    assert first < hard
    time.sleep(0.3)
    r = client.post(f"/v1/leases/{body['lease_id']}/heartbeat")
    assert r.status_code == 200 and datetime.fromisoformat(r.json()["expires_at"]) > first  # extended
    _sleep_until(hard - timedelta(seconds=settings.lease_ttl_s - 0.1))  # now + ttl is past the hard deadline
    r = client.post(f"/v1/leases/{body['lease_id']}/heartbeat")
    assert r.status_code == 200 and datetime.fromisoformat(r.json()["expires_at"]) == hard  # capped at it
    _sleep_until(hard + timedelta(seconds=0.2))
    assert client.post(f"/v1/leases/{body['lease_id']}/heartbeat").status_code == 409


def test_workers_list_shows_identity_and_lease(client):
    capture(client, shapes(1))
    body = lease(client, worker="gpu-7").json()
    (w,) = client.get("/v1/workers").json()
    assert w["worker_id"] == "gpu-7" and w["lease_id"] == body["lease_id"] and not w["stale"]


def test_a_shape_read_under_one_lease_is_not_written_once_another_lease_holds_it(client, settings):
    """A write decided on a shape as read (leased by A) must not land once the shape went back to the queue
    and another lease B took it meanwhile: the state alone reads "leased" both times, the lease does not."""
    from app.domain import lease_states as ls
    from app.errors import Conflict
    from app.services import leasing
    capture(client, shapes(1))
    a = lease(client, worker="a").json()
    db = client.app.state.db
    with db.plain() as p:
        (stale,) = p.shape_rows("held", {"lid": a["lease_id"]})  # as A's release would read it
    r = client.post(f"/v1/leases/{a['lease_id']}/results", json={
        "shape_id": stale.id, "backend": "torch", "status": "failed", "error": "boom"})
    assert r.json()["shape_state"] == "queued"
    b = lease(client, worker="b").json()
    assert [x["shape_id"] for x in b["shapes"]] == [stale.id]
    with pytest.raises(Conflict), db.plain() as p:
        p.drive(leasing._write_facts(p, [(stale, ls.release(leasing._row_facts(stale), a["lease_id"], False,
                                                            settings.max_attempts))], leasing.utcnow()))
    with db.plain() as p:
        (now,) = p.shape_rows("shape", {"sid": stale.id})
    assert (now.state, now.lease_id) == ("leased", b["lease_id"])  # still B's


def test_a_lease_and_its_release_take_the_same_round_trips_whatever_their_shapes(client, settings, tmp_path):
    """PostgreSQL: a lease's shapes are written with its row in one round trip, the release reads the lease with
    its shapes in one and writes them with its end in another, and BEGIN goes with the first statements. A round
    trip is a ReadyForQuery from the server (one per query or pipeline sync) in libpq's trace of the connection."""
    from sqlalchemy import event

    from app.schemas import LeaseIn
    from app.services import leasing
    db = client.app.state.db
    if db.is_sqlite:
        pytest.skip("round trips to a database server: PostgreSQL only")
    import psycopg
    capture(client, shapes(12))
    log = tmp_path / "libpq.trace"

    def trips(steps, on_loop: bool) -> tuple[object, int]:  # type: ignore[no-untyped-def]
        """steps(p) driven in one transaction, as a thread drives them (Plain) or the event loop (AsyncPlain)."""
        def trace(pgconn, f) -> None:  # type: ignore[no-untyped-def]
            pgconn.trace(f.fileno())
            pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)

        with open(log, "w") as f:
            if on_loop:
                async def go():  # type: ignore[no-untyped-def]
                    async with db.aplain() as p:
                        trace(p.conn.pgconn, f)
                        out = await p.drive(steps(p))
                    p.conn.pgconn.untrace()
                    return out
                out = asyncio.run(go())
            else:
                def on(conn, _rec, _proxy):  # type: ignore[no-untyped-def]
                    trace(conn.pgconn, f)

                def off(conn, _rec):  # type: ignore[no-untyped-def]
                    conn.pgconn.untrace()
                event.listen(db.engine, "checkout", on)
                event.listen(db.engine, "checkin", off)
                try:
                    with db.plain() as p:
                        out = p.drive(steps(p))
                finally:
                    event.remove(db.engine, "checkout", on)
                    event.remove(db.engine, "checkin", off)
        return out, sum("ReadyForQuery" in line for line in log.read_text().splitlines())

    def lease_and_release(n: int, on_loop: bool = False) -> tuple[int, int]:
        body = LeaseIn(image_digest=DIGEST, gfx="gfx942", cu_num=304, worker_id="w1", backends=["torch"],
                       budget_s=600, max_shapes=n)
        out, leased = trips(lambda p: leasing.lease_batch(p, body, settings), on_loop)
        back, released = trips(lambda p: leasing.release(p, out.lease_id, settings), on_loop)
        assert back == len(out.shapes) == n
        return leased, released

    lease_and_release(1)  # the cost estimate and the headers are cached from here on
    # BEGIN with the worker's touch and the campaigns; the pick; the lease's row and its shapes; COMMIT.
    # The lease with its shapes; its end and their writes; COMMIT.
    assert lease_and_release(1) == lease_and_release(8) == (4, 3)
    # the same steps driven on the event loop (the lease routes on PostgreSQL): the same round trips
    assert lease_and_release(1, on_loop=True) == lease_and_release(8, on_loop=True) == (4, 3)


def test_on_postgresql_a_lease_its_heartbeat_and_release_take_no_thread(client, monkeypatch):
    """PostgreSQL: the lease routes drive their steps on the event loop's connections (Database.aplain), without
    the hop to a thread and back (closed loop: a tenth of a lease+release's server CPU); a lease that finds no
    work still says why, from a thread (a rare, heavier read)."""
    if client.app.state.db.is_sqlite:
        pytest.skip("SQLite's driver has no async form: its lease routes run on threads")
    from app.api.routes import leases
    hops = []
    real = leases.Fleet.run

    async def counted(self, work):  # type: ignore[no-untyped-def]
        hops.append(work)
        return await real(self, work)
    monkeypatch.setattr(leases.Fleet, "run", counted)
    capture(client, shapes(2))
    a = lease(client).json()
    assert client.post(f"/v1/leases/{a['lease_id']}/heartbeat").status_code == 200
    assert client.post(f"/v1/leases/{a['lease_id']}/release").json()["requeued"] == 2
    assert hops == []
    assert lease(client, gfx="gfx950").status_code == 204 and len(hops) == 1
