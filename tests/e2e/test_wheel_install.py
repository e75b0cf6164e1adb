"""A regular (non-editable) install runs: the wheel built from the sdist, installed with pip into a fresh venv,
starts the service (migrating a new database from the migrations it ships), manages tokens, and runs a worker
that tunes a shape, all from a folder outside the checkout."""

from __future__ import annotations

import json
import subprocess
import tarfile
import zipfile

import httpx
import pytest

from app.cli import EXAMPLE_DIGEST
from tests.conftest import ROOT
from tests.e2e import installed

pytestmark = pytest.mark.e2e


def run(bin_, *argv, env, cwd, timeout=600):
    p = subprocess.run([str(bin_ / argv[0]), *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, f"{argv}: {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


def test_the_dists_carry_every_migration(tmp_path):
    wheel, sdist = installed.build(tmp_path)
    shipped = {p.relative_to(ROOT).as_posix() for p in (ROOT / "app" / "migrations").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert "app/migrations/versions/0001_initial_schema.py" in shipped
    assert shipped <= set(zipfile.ZipFile(wheel).namelist())
    in_sdist = {n.partition("/")[2] for n in tarfile.open(sdist).getnames()}  # under aiter_tuner-<version>/
    assert shipped <= in_sdist and "alembic.ini" not in zipfile.ZipFile(wheel).namelist()


@pytest.mark.timeout(1200)
def test_an_installed_wheel_serves_makes_tokens_and_runs_a_worker(tmp_path):
    wheel, _ = installed.build(tmp_path / "dist")
    bin_ = installed.venv(tmp_path / "venv")
    work = tmp_path / "run"  # the cwd of every command: nothing to import from here
    work.mkdir()
    port = installed.free_port()
    url = f"http://127.0.0.1:{port}"
    env = installed.env(bin_, DATABASE_URL=f"sqlite:///{tmp_path / 'db' / 'tuner.db'}",
                        TUNER_ADMIN_TOKEN_FILE=str(tmp_path / "secrets" / "admin_token"), TUNER_PORT=str(port),
                        TUNER_SERVICE_URL=url)
    # the declared requirements, resolved against the tested packages (no index): a missing one fails here
    run(bin_, "pip", "install", "-q", f"{wheel}[server,worker,torch]", env=env, cwd=work)
    where = run(bin_, "python", "-c", "import app, workers; print(app.__file__); print(workers.__file__)",
                env=env, cwd=work).split()
    site = str(tmp_path / "venv" / "lib")
    assert all(w.startswith(site) for w in where), where  # the wheel's copy, not the checkout's

    log = tmp_path / "serve.log"
    with log.open("w") as out:
        server = subprocess.Popen([str(bin_ / "aiter-tuner"), "serve"], cwd=work, env=env, stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        installed.wait_healthy(url, server, log)
        assert (tmp_path / "secrets" / "admin_token").exists()
        worker = json.loads(run(bin_, "aiter-tuner", "token", "create", "--role", "worker", "--name", "w1",
                                env=env, cwd=work))
        capture = json.loads(run(bin_, "aiter-tuner", "token", "create", "--role", "capture", "--name", "c1",
                                 env=env, cwd=work))
        listed = {t["name"]: t["role"] for t in json.loads(run(bin_, "aiter-tuner", "token", "list", env=env,
                                                                cwd=work))}
        assert listed == {"bootstrap-admin": "admin", "w1": "worker", "c1": "capture"}, listed
        run(bin_, "aiter-tuner", "example-capture", "--gfx", "cpu", env=dict(env, TUNER_TOKEN=capture["token"]),
            cwd=work)
        out = run(bin_, "aiter-tuner-worker", "--backend", "torch", "--once", "--budget-s", "60",
                  "--max-shapes", "1", "--max-batches", "1", "--image-digest", EXAMPLE_DIGEST,
                  env=dict(env, TUNER_TOKEN=worker["token"]), cwd=work)
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["gfx"] == "cpu" and summary["posted"] == 1 and summary["refused"] == 0, summary
        camp = httpx.get(f"{url}/v1/campaigns/1").json()
        assert camp["tuned"] == 1, camp
        csv = httpx.get(f"{url}/v1/overlays/{EXAMPLE_DIGEST}/bf16_gemm.csv", params={"version": "latest"})
        assert csv.status_code == 200 and csv.text.startswith("gfx,cu_num,M,N,K"), csv.text[:300]
    finally:
        installed.stop(server)
    assert server.returncode is not None
