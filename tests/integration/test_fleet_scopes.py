"""A digest-scoped token meets only its own images (issue 26): its capture_uids are its image's own, and no answer
(a 'no work' reason, a refusal) names another image's digest or queue."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.config import Settings
from app.db.session import Database
from app.main import create_app
from app.services import tokens
from tests.conftest import DIGEST, OTHER_DIGEST
from tests.integration.test_auth import CAPTURE, LEASE, h


@pytest.fixture
def env(db_url, tmp_path):
    settings = Settings(database_url=db_url, auth=True, read_open=False, admin_token="atk_admin",
                        admin_token_file=str(tmp_path / "admin_token"))
    with TestClient(create_app(settings)) as c:
        db = Database(db_url)
        with db.session() as s:
            sec = {f"{role}-{tag}": tokens.create(s, f"{role}-{tag}", role, [d])[1]
                   for role in ("capture", "worker", "read") for tag, d in (("a", DIGEST), ("b", OTHER_DIGEST))}
        yield c, sec
        db.dispose()


def test_a_capture_uid_is_unique_within_its_image_only(env):
    c, sec = env
    a = c.post("/v1/captures", json={**CAPTURE, "capture_uid": "agent-1:bf16_gemm:7"}, headers=h(sec["capture-a"]))
    assert a.status_code == 201 and not a.json()["duplicate"], a.text
    b = c.post("/v1/captures", json={**CAPTURE, "image_digest": OTHER_DIGEST, "capture_uid": "agent-1:bf16_gemm:7"},
               headers=h(sec["capture-b"]))
    assert b.status_code == 201, b.text
    got = b.json()
    assert not got["duplicate"] and got["shapes_new"] == 4 and got["campaign_id"] != a.json()["campaign_id"]
    again = c.post("/v1/captures", json={**CAPTURE, "image_digest": OTHER_DIGEST, "capture_uid": "agent-1:bf16_gemm:7"},
                   headers=h(sec["capture-b"])).json()
    assert again["duplicate"] and again["capture_id"] == got["capture_id"]  # a repeat within the image still is one
    camp = c.get(f"/v1/campaigns/{got['campaign_id']}", headers=h(sec["read-b"])).json()
    assert {s["calls"] for s in camp["shape_list"]} == {1} and len(camp["shape_list"]) == 4


def test_no_answer_to_a_scoped_token_names_another_images_digest_or_queue(env):
    c, sec = env
    cid = c.post("/v1/captures", json=CAPTURE, headers=h(sec["capture-a"])).json()["campaign_id"]
    short = DIGEST[:11]
    admin = c.post("/v1/leases", json={**LEASE, "image_digest": OTHER_DIGEST}, headers=h("atk_admin"))
    assert admin.status_code == 204 and short in admin.headers["x-tuner-idle-reason"]  # an admin sees every queue
    r = c.post("/v1/leases", json={**LEASE, "image_digest": OTHER_DIGEST}, headers=h(sec["worker-b"]))
    assert r.status_code == 204, r.text
    reason = r.headers["x-tuner-idle-reason"]
    assert short not in reason and "4 queued" not in reason and "no campaign has queued shapes" in reason
    r = c.get(f"/v1/campaigns/{cid}", headers=h(sec["read-b"]))
    assert r.status_code == 403 and DIGEST not in r.text


def test_sign_in_refuses_another_sites_form_and_the_cookie_can_be_secure(env):
    c, sec = env
    form = {"token": sec["read-a"], "next": "/"}
    for header in ({"Origin": "https://evil.example"}, {"Referer": "https://evil.example/page"},
                   {"Origin": "null"}):
        r = c.post("/signin", data=form, headers=header, follow_redirects=False)
        assert r.status_code == 403 and "tuner_token" not in r.headers.get("set-cookie", ""), header
    r = c.post("/signin", data=form, headers={"Origin": "http://testserver"}, follow_redirects=False)
    assert r.status_code == 303 and "tuner_token" in r.headers["set-cookie"]
    assert "secure" not in r.headers["set-cookie"].lower()
    c.app.state.settings.cookie_secure = True
    r = c.post("/signin", data=form, headers={"Referer": "http://testserver/campaigns/1"}, follow_redirects=False)
    assert r.status_code == 303 and "secure" in r.headers["set-cookie"].lower()


def test_a_token_scoped_to_a_child_image_never_learns_its_parents_digest(env):
    """Issue 35: a capture's note named the image its (client-chosen) host last ran, and a read token scoped to a
    child image saw the parent's digest on campaign and overlay reads although lineage hides it."""
    from tests.integration.test_upgrades_api import tune
    c, sec = env
    assert c.post("/v1/captures", json={**CAPTURE, "host": "h1"}, headers=h(sec["capture-a"])).status_code == 201
    r = c.post("/v1/captures", json={**CAPTURE, "image_digest": OTHER_DIGEST, "host": "h1"},
               headers=h(sec["capture-b"]))
    assert r.status_code == 201 and DIGEST not in r.text, r.text
    c.headers["Authorization"] = "Bearer atk_admin"  # the admin tunes the parent and inherits
    try:
        tune(c)
        assert c.post(f"/v1/images/{OTHER_DIGEST}/inherit", json={"from": DIGEST}).status_code == 201
    finally:
        del c.headers["Authorization"]
    cid = [x for x in c.get("/v1/campaigns", headers=h("atk_admin")).json()
           if x["image_digest"] == OTHER_DIGEST][0]["campaign_id"]
    reads = [f"/v1/campaigns/{cid}", f"/v1/overlays/{OTHER_DIGEST}/bf16_gemm", f"/campaigns/{cid}",
             f"/v1/images/{OTHER_DIGEST}/lineage", f"/v1/overlays/{OTHER_DIGEST}/bf16_gemm/deploy"]
    for url in reads:
        r = c.get(url, headers=h(sec["read-b"]))
        assert r.status_code == 200 and DIGEST not in r.text, (url, r.text[:3000])
    # the admin still sees where the rows came from
    assert c.get(f"/v1/campaigns/{cid}", headers=h("atk_admin")).json()["upgrade"]["from_digest"] == DIGEST
    assert c.get(f"/v1/overlays/{OTHER_DIGEST}/bf16_gemm", headers=h("atk_admin")).json()["carried_from"] == DIGEST
