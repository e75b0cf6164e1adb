"""Tokens over HTTP for admins (create, list, revoke), digests validated; the CLI refuses a bad digest too."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from app.config import Settings
from app.main import create_app
from tests.conftest import DIGEST, ROOT

ADMIN = {"Authorization": "Bearer atk_boot"}


@pytest.fixture
def c(db_url, tmp_path):
    settings = Settings(database_url=db_url, auth=True, admin_token="atk_boot",
                        admin_token_file=str(tmp_path / "admin_token"))
    with TestClient(create_app(settings)) as client:
        yield client


def test_an_admin_creates_lists_and_revokes_tokens_and_the_secret_is_shown_once(c):
    r = c.post("/v1/tokens", json={"name": "pool-a", "role": "worker", "digests": [DIGEST]}, headers=ADMIN)
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["token"].startswith("atk_") and made["digests"] == [DIGEST] and not made["revoked"]
    worker = {"Authorization": f"Bearer {made['token']}"}
    listed = c.get("/v1/tokens", headers=ADMIN).json()
    assert [t["name"] for t in listed] == ["bootstrap-admin", "pool-a"]
    assert all(t["token"] is None for t in listed), "a stored token is never shown again"
    assert c.get("/v1/tokens", headers=worker).status_code == 403
    assert c.post("/v1/tokens", json={"name": "x", "role": "admin"}, headers=worker).status_code == 403
    assert c.get("/v1/tokens").status_code == 401

    assert c.delete(f"/v1/tokens/{made['id']}", headers=ADMIN).json()["revoked"]
    assert c.get("/v1/workers", headers=worker).status_code == 401  # revoked: refused at once
    assert c.delete(f"/v1/tokens/{made['id']}", headers=ADMIN).status_code == 404


@pytest.mark.parametrize("body, field", [
    ({"name": "x", "role": "worker", "digests": ["notadigest"]}, "digests.0"),
    ({"name": "x", "role": "worker", "digests": ["sha256:" + "AB" * 32]}, "digests.0"),
    ({"name": "x", "role": "root"}, "role"),
    ({"name": "", "role": "read"}, "name"),
])
def test_bad_token_requests_name_the_field_and_store_nothing(c, body, field):
    r = c.post("/v1/tokens", json=body, headers=ADMIN)
    assert r.status_code == 422 and r.json()["field"] == field, r.text
    assert len(c.get("/v1/tokens", headers=ADMIN).json()) == 1


def test_rotating_the_bootstrap_admin_token(c):
    boot_id = c.get("/v1/tokens", headers=ADMIN).json()[0]["id"]
    r = c.delete(f"/v1/tokens/{boot_id}", headers=ADMIN)
    assert r.status_code == 409 and "last admin token" in r.json()["detail"]
    new = c.post("/v1/tokens", json={"name": "admin-2027", "role": "admin"}, headers=ADMIN).json()["token"]
    assert c.delete(f"/v1/tokens/{boot_id}", headers={"Authorization": f"Bearer {new}"}).status_code == 200
    assert c.get("/v1/tokens", headers=ADMIN).status_code == 401


def test_the_cli_refuses_a_bad_digest(db_url):
    env = dict(os.environ, DATABASE_URL=db_url)
    p = subprocess.run([sys.executable, "-m", "app.cli", "token", "create", "--role", "worker", "--name", "w",
                        "--digest", "notadigest"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == 2 and "notadigest" in p.stderr and "digests" in p.stderr
    out = subprocess.run([sys.executable, "-m", "app.cli", "token", "list"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout
    assert '"name": "w"' not in out
