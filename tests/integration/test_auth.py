"""Access control: every role against every endpoint it must not reach; lease ownership; revocation."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from app.config import Settings
from app.db.session import Database
from app.main import create_app
from app.services import tokens
from tests.conftest import DIGEST, OTHER_DIGEST

ROLES = ("capture", "worker", "admin", "read")
CAPTURE = {"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304, "family": "bf16_gemm",
           "shapes": [{"M": m, "N": 64, "K": 64} for m in (1, 2, 3, 4)]}
LEASE = {"worker_id": "w", "image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304, "backends": ["torch"],
         "budget_s": 1000}


@pytest.fixture
def env(db_url, tmp_path):
    settings = Settings(database_url=db_url, auth=True, read_open=False, admin_token="atk_admin",
                        admin_token_file=str(tmp_path / "admin_token"), token_cache_s=2.0)
    with TestClient(create_app(settings)) as c:
        db = Database(db_url)
        with db.session() as s:
            secrets = {role: tokens.create(s, role, role)[1] for role in ROLES if role != "admin"}
            secrets["admin"] = "atk_admin"
            secrets["worker2"] = tokens.create(s, "worker2", "worker")[1]
            secrets["scoped"] = tokens.create(s, "scoped", "capture", [OTHER_DIGEST])[1]
        yield c, secrets, db
        db.dispose()


def h(secret, worker=None):
    """worker: the X-Tuner-Worker header a worker sends on its leases."""
    return {"Authorization": f"Bearer {secret}", **({"X-Tuner-Worker": worker} if worker else {})}


def endpoints(c, sec):
    """(method, path, json, roles allowed); a live lease and campaign to aim at."""
    cid = c.post("/v1/captures", json=CAPTURE, headers=h(sec["admin"])).json()["campaign_id"]
    lease = c.post("/v1/leases", json=LEASE, headers=h(sec["worker"])).json()
    lid, item = lease["lease_id"], lease["shapes"][0]
    result = {"shape_id": item["shape_id"], "backend": "torch", "status": "failed", "error": "x"}
    log = {"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304, "family": "bf16_gemm", "log": ""}
    reads = {"read", "capture", "worker", "admin"}
    return [
        ("POST", "/v1/captures", CAPTURE, {"capture", "admin"}),
        ("POST", "/v1/engagement/logs", log, {"capture", "admin"}),
        ("POST", "/v1/leases", LEASE, {"worker", "admin"}),
        ("POST", f"/v1/leases/{lid}/heartbeat", None, {"worker", "admin"}),
        ("POST", f"/v1/leases/{lid}/results", result, {"worker", "admin"}),
        ("POST", f"/v1/leases/{lid}/release", None, {"worker", "admin"}),
        ("PUT", f"/v1/images/{DIGEST}/tables", {"tables": {}}, {"worker", "admin"}),
        ("POST", f"/v1/campaigns/{cid}/requeue-failed", None, {"admin"}),
        ("GET", "/v1/campaigns", None, reads),
        ("GET", f"/v1/campaigns/{cid}", None, reads),
        ("GET", f"/v1/campaigns/{cid}/engagement", None, reads),
        ("GET", "/v1/workers", None, reads),
        ("GET", f"/v1/overlays/{DIGEST}/bf16_gemm.csv", None, reads),
        ("GET", f"/v1/overlays/{DIGEST}/bf16_gemm", None, reads),
    ]


def test_every_role_is_refused_where_it_does_not_belong(env):
    c, sec, _ = env
    for method, path, body, allowed in endpoints(c, sec):
        r = c.request(method, path, json=body)
        assert r.status_code == 401, (method, path, r.text)
        assert "token" in r.json()["detail"]
        for role in ROLES:
            if role in allowed:
                continue
            r = c.request(method, path, json=body, headers=h(sec[role]))
            assert r.status_code == 403, (role, method, path, r.status_code)
            assert role in r.json()["detail"]
        r = c.request(method, path, json=body, headers=h("atk_not-a-token"))
        assert r.status_code == 401


def test_allowed_roles_get_through(env):
    c, sec, _ = env
    eps = endpoints(c, sec)
    for method, path, body, allowed in eps:
        if "release" in path or "results" in path:
            continue  # would end the lease the other checks use
        for role in allowed & {"capture", "read"}:
            r = c.request(method, path, json=body, headers=h(sec[role]))
            assert r.status_code < 400 or r.status_code == 422, (role, path, r.text)


def test_a_result_for_another_workers_lease_is_refused_and_nothing_stored(env):
    c, sec, db = env
    c.post("/v1/captures", json=CAPTURE, headers=h(sec["capture"]))
    lease = c.post("/v1/leases", json=LEASE, headers=h(sec["worker"])).json()
    item = lease["shapes"][0]
    row = dict(item["shape"], gfx="gfx942", cu_num="304", libtype="torch", solidx="0", splitK="0", us="1",
               kernelName="k", err_ratio="0", tflops="1", bw="1")
    res = {"shape_id": item["shape_id"], "backend": "torch", "status": "ok", "row": row, "us": 1.0, "err_ratio": 0}
    r = c.post(f"/v1/leases/{lease['lease_id']}/results", json=res, headers=h(sec["worker2"], "w"))
    assert r.status_code == 403 and r.json()["field"] == "lease_id"
    assert c.post(f"/v1/leases/{lease['lease_id']}/release", headers=h(sec["worker2"], "w")).status_code == 403
    camp = c.get(f"/v1/campaigns/{lease['campaign_id']}", headers=h(sec["read"])).json()
    assert camp["tuned"] == 0 and all(x["kernel"] is None for x in camp["shape_list"])
    ok = c.post(f"/v1/leases/{lease['lease_id']}/results", json=res, headers=h(sec["worker"], "w"))
    assert ok.status_code == 200 and ok.json()["verified"]


def test_scoped_token_only_reaches_its_digests(env):
    c, sec, _ = env
    r = c.post("/v1/captures", json=CAPTURE, headers=h(sec["scoped"]))
    assert r.status_code == 403 and r.json()["field"] == "image_digest"
    assert c.get("/v1/campaigns", headers=h(sec["read"])).json() == []
    assert c.post("/v1/captures", json=dict(CAPTURE, image_digest=OTHER_DIGEST),
                  headers=h(sec["scoped"])).status_code == 201


def test_a_revoked_token_stops_once_the_token_cache_lets_go(env, monkeypatch):
    from types import SimpleNamespace

    from app import ttl_cache
    c, sec, db = env
    # the caches' clock is the test's: "within 2 s" is then a state, not how fast a loaded machine posts twice
    now = [time.monotonic()]
    monkeypatch.setattr(ttl_cache, "time", SimpleNamespace(monotonic=lambda: now[0]))
    assert c.post("/v1/captures", json=CAPTURE, headers=h(sec["capture"])).status_code == 201
    with db.session() as s:
        tid = next(t["id"] for t in tokens.listing(s) if t["name"] == "capture")
        assert tokens.revoke(s, tid)
    # resolved tokens are trusted for token_cache_s (2 s here): the documented revocation delay
    assert c.post("/v1/captures", json=CAPTURE, headers=h(sec["capture"])).status_code == 201
    now[0] += 2.1
    r = c.post("/v1/captures", json=CAPTURE, headers=h(sec["capture"]))
    assert r.status_code == 401 and "revoked" in r.json()["detail"]


def test_tokens_are_stored_hashed_and_a_first_start_prints_one(db_url, tmp_path, capsys):
    path = tmp_path / "tok"
    create_app(Settings(database_url=db_url, admin_token_file=str(path)))
    secret = path.read_text().strip()
    assert secret in capsys.readouterr().err and oct(path.stat().st_mode & 0o777) == "0o600"
    db = Database(db_url)
    with db.session() as s:
        assert tokens.find(s, secret).role == "admin"
        from sqlalchemy import select

        from app.db.models import Token
        assert secret not in {t.token_hash for t in s.scalars(select(Token))}
    db.dispose()
    create_app(Settings(database_url=db_url, admin_token_file=str(tmp_path / "again")))
    assert not (tmp_path / "again").exists(), "only the first start makes an admin token"


def test_reads_can_be_open(db_url, tmp_path):
    s = Settings(database_url=db_url, read_open=True, admin_token="atk_a", admin_token_file=str(tmp_path / "t"))
    with TestClient(create_app(s)) as c:
        assert c.get("/v1/campaigns").status_code == 200
        assert c.post("/v1/captures", json=CAPTURE).status_code == 401


def test_a_worker_id_is_bound_to_the_token_that_registered_it(env):
    c, secrets, _ = env
    assert c.post("/v1/captures", json=CAPTURE, headers=h(secrets["capture"])).status_code == 201
    assert c.post("/v1/leases", json={**LEASE, "max_shapes": 1}, headers=h(secrets["worker"])).status_code == 200
    r = c.post("/v1/leases", json={**LEASE, "host": "impostor"}, headers=h(secrets["worker2"]))
    assert r.status_code == 403 and r.json()["field"] == "worker_id", r.text
    (w,) = c.get("/v1/workers", headers=h(secrets["admin"])).json()
    assert w["host"] is None  # not overwritten by the other token
    ok = c.post("/v1/leases", json={**LEASE, "worker_id": "w2", "max_shapes": 1}, headers=h(secrets["worker2"]))
    assert ok.status_code == 200


def test_workers_sharing_a_token_act_only_on_their_own_leases(env):
    """One pool token, two workers: each lease answers only to the worker it was granted to."""
    c, sec, _ = env
    assert c.post("/v1/captures", json=CAPTURE, headers=h(sec["capture"])).status_code == 201
    mine = c.post("/v1/leases", json={**LEASE, "worker_id": "a", "max_shapes": 2}, headers=h(sec["worker"])).json()
    other = c.post("/v1/leases", json={**LEASE, "worker_id": "b", "max_shapes": 2}, headers=h(sec["worker"])).json()
    lid, item = other["lease_id"], other["shapes"][0]
    failed = {"shape_id": item["shape_id"], "backend": "torch", "status": "failed", "error": "x"}
    for path, body in ((f"/v1/leases/{lid}/heartbeat", None), (f"/v1/leases/{lid}/results", failed),
                       (f"/v1/leases/{lid}/release", None)):
        r = c.post(path, json=body, headers=h(sec["worker"], "a"))
        assert r.status_code == 403 and r.json()["field"] == "worker_id", (path, r.text)
        assert "granted to worker 'b'" in r.json()["detail"]
        r = c.post(path, json=body, headers=h(sec["worker"]))  # not saying who acts is refused too
        assert r.status_code == 422 and r.json()["field"] == "X-Tuner-Worker", (path, r.text)
    camp = c.get(f"/v1/campaigns/{other['campaign_id']}", headers=h(sec["read"])).json()
    held = {x["shape_id"]: (x["state"], x["attempts"]) for x in camp["shape_list"]}
    assert all(held[x["shape_id"]] == ("leased", 0) for x in other["shapes"]), "b's lease untouched"
    assert c.post(f"/v1/leases/{lid}/heartbeat", headers=h(sec["worker"], "b")).status_code == 200
    assert c.post(f"/v1/leases/{mine['lease_id']}/release", headers=h(sec["worker"], "a")).json()["requeued"] == 2


def test_a_digest_scoped_admin_acts_on_its_images_only(env):
    """Leases, campaigns, overlays and tokens of other images are out of a scoped admin's reach."""
    c, sec, db = env
    with db.session() as s:
        scoped = tokens.create(s, "admin-other", "admin", [OTHER_DIGEST])[1]
    assert c.post("/v1/captures", json=CAPTURE, headers=h(sec["capture"])).status_code == 201
    lease = c.post("/v1/leases", json=LEASE, headers=h(sec["worker"])).json()
    lid, cid = lease["lease_id"], lease["campaign_id"]
    failed = {"shape_id": lease["shapes"][0]["shape_id"], "backend": "torch", "status": "failed", "error": "x"}
    for path, body in ((f"/v1/leases/{lid}/heartbeat", None), (f"/v1/leases/{lid}/results", failed),
                       (f"/v1/leases/{lid}/release", None), (f"/v1/campaigns/{cid}/requeue-failed", None),
                       ("/v1/leases", LEASE)):
        r = c.post(path, json=body, headers=h(scoped))
        assert r.status_code == 403 and r.json()["field"] == "image_digest", (path, r.text)
    for path in (f"/v1/overlays/{DIGEST}/bf16_gemm.csv", f"/v1/overlays/{DIGEST}/bf16_gemm/deploy",
                 f"/v1/campaigns/{cid}"):
        assert c.get(path, headers=h(scoped)).status_code == 403, path
    # tokens: a scoped admin neither sees, revokes nor mints a token reaching other images
    listed = {t["name"] for t in c.get("/v1/tokens", headers=h(scoped)).json()}
    assert listed == {"admin-other", "scoped"}
    everyone = {t["name"]: t["id"] for t in c.get("/v1/tokens", headers=h(sec["admin"])).json()}
    r = c.delete(f"/v1/tokens/{everyone['worker']}", headers=h(scoped))
    assert r.status_code == 403 and r.json()["field"] == "token_id"
    for digests in (None, [DIGEST], [OTHER_DIGEST, DIGEST]):
        r = c.post("/v1/tokens", json={"name": "wide", "role": "admin", "digests": digests}, headers=h(scoped))
        assert r.status_code == 403 and r.json()["field"] == "digests", digests
    ok = c.post("/v1/tokens", json={"name": "narrow", "role": "worker", "digests": [OTHER_DIGEST]},
                headers=h(scoped))
    assert ok.status_code == 201
    assert c.delete(f"/v1/tokens/{ok.json()['id']}", headers=h(scoped)).status_code == 200
    heartbeat = c.post(f"/v1/leases/{lid}/heartbeat", headers=h(sec["worker"], "w"))
    assert heartbeat.status_code == 200, "the lease lived through it all"


def test_dashboard_pages_honour_scopes_and_a_browser_signs_in(env):
    """Reads closed: every page needs a token (a sign-in form answers); a browser signs in once (a cookie that
    page loads send, never writes); a digest-scoped token sees its images only."""
    c, sec, db = env
    with db.session() as s:
        read_other = tokens.create(s, "read-other", "read", [OTHER_DIGEST])[1]
    assert c.post("/v1/captures", json=CAPTURE, headers=h(sec["capture"])).status_code == 201
    assert c.post("/v1/captures", json={**CAPTURE, "image_digest": OTHER_DIGEST, "cu_num": 80},
                  headers=h(sec["capture"])).status_code == 201
    c.post("/v1/leases", json={**LEASE, "max_shapes": 1}, headers=h(sec["worker"]))
    camps = {x["image_digest"]: x["campaign_id"] for x in c.get("/v1/campaigns", headers=h(sec["admin"])).json()}
    pages = ["/", "/workers", "/tokens", "/favicon.ico", f"/campaigns/{camps[DIGEST]}",
             f"/campaigns/{camps[DIGEST]}/coverage.svg"]
    for path in pages:
        r = c.get(path)
        assert r.status_code == 401 and 'action="/signin"' in r.text, path
    assert c.get("/healthz").status_code == 200
    for path in pages:
        assert c.get(path, headers=h(sec["read"])).status_code == 200, path

    r = c.post("/signin", data={"token": "atk_wrong", "next": "/workers"}, follow_redirects=False)
    assert r.status_code == 401 and "tuner_token" not in r.headers.get("set-cookie", "")
    r = c.post("/signin", data={"token": read_other, "next": "/"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/" and "HttpOnly" in r.headers["set-cookie"]
    home = c.get("/")  # the cookie now rides along
    assert home.status_code == 200 and OTHER_DIGEST in home.text and DIGEST not in home.text
    assert c.get(f"/campaigns/{camps[OTHER_DIGEST]}").status_code == 200
    for path in (f"/campaigns/{camps[DIGEST]}", f"/campaigns/{camps[DIGEST]}/coverage.svg"):
        r = c.get(path)
        assert r.status_code == 403 and DIGEST not in r.text, path  # nor the digest of what it may not see
    assert "w" not in {w["worker_id"] for w in c.get("/v1/workers").json()}  # its worker served DIGEST
    assert ">w<" not in c.get("/workers").text
    r = c.post("/v1/captures", json={**CAPTURE, "image_digest": OTHER_DIGEST})
    assert r.status_code == 401, "a cookie never authorises a write"
