"""Workers as a Slurm array on a real slurmctld + slurmd (issue 33): `aiter-tuner launch slurm` writes the sbatch
script (one task per GPU, the token read from a file), sbatch submits it to a one-host cluster
(tests/e2e/slurm_cluster.py), its CPU workers (the aiter backend driving the stand-in AITER tuner) tune a campaign
of a real service; one task is `scancel`ed mid-lease (decided by the service's database). Then: 0 shapes lost, 0
tuned twice, every other task exits 0 (COMPLETED 0:0: each worker's --once ends it when nothing is queued or
leased), and `scancel` of the job leaves nothing running. The plain runtime (the worker installed on the node);
--gpu-request none, since this host has no GPU."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import DIGEST, ROOT, wait_for
from tests.e2e import launched, served_image, slurm_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # a hang guard: ~1-2 min each on a 2-core VM

N_SHAPES, N_TASKS = 18, 3
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = slurm_cluster.available()
    assert why is None, why
    c, pids = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    yield c
    slurm_cluster.stop(pids)


def launch(tmp: Path, url: str, token_file: Path, *extra: str) -> subprocess.CompletedProcess:
    stub = served_image.write_stub_tree(tmp / "aiter")
    env = {**launched.WORKER_ENV, "AITER_ROOT": str(tmp / "aiter"), "STUB_SOURCE": str(stub),
           "TUNER_SPOOL_DIR": str(tmp / "spool")}
    return subprocess.run([str(BIN / "aiter-tuner"), "launch", "slurm", "--service", url, "--image-digest", DIGEST,
                           "--gpus", str(N_TASKS), "--token-file", str(token_file), "--gpu-request", "none",
                           "--job-name", "tuner-test", "--output", str(tmp / "task-%A_%a.out"),
                           "--worker-command", str(BIN / "aiter-tuner-worker"), "--backend", "aiter",
                           *[a for k, v in env.items() for a in ("--env", f"{k}={v}")], *extra],
                          cwd=tmp, capture_output=True, text=True, timeout=120)


def outputs(tmp: Path, job: str) -> dict[int, str]:
    return {int(p.stem.rsplit("_", 1)[1]): p.read_text() for p in tmp.glob(f"task-{job}_*.out")}


def test_an_array_tunes_a_campaign_through_a_task_cancelled_mid_lease(tmp_path, cluster):
    t0 = time.monotonic()
    svc, token = launched.start(tmp_path, DIGEST, N_SHAPES, "slurm-array")
    tok = launched.token_file(tmp_path, token)
    job = None
    try:
        r = launch(tmp_path, svc.srv.url, tok, "-o", str(tmp_path / "job.sbatch"))
        assert r.returncode == 0, r.stderr
        script = (tmp_path / "job.sbatch").read_text()
        assert f"#SBATCH --array=0-{N_TASKS - 1}" in script and token not in script
        job = cluster.run("sbatch", "--parsable", f"--chdir={tmp_path}", str(tmp_path / "job.sbatch")
                          ).strip().split(";")[0]

        def alive() -> None:
            failed = {i: t for i, t in cluster.tasks(job).items() if t["JobState"] in ("FAILED", "NODE_FAIL")}
            assert not failed, f"{failed}\n{outputs(tmp_path, job)}\n{cluster.logs()}"
        wid, lease = launched.wait_mid_lease(svc, alive)
        assert wid.startswith(f"tuner-test-{job}-"), f"not one worker id per task: {wid}"
        task = int(wid.rsplit("-", 1)[1])
        cluster.run("scancel", f"{job}_{task}")
        cancelled_at = time.monotonic() - t0
        wait_for(lambda: svc.states().get("tuned", 0) == N_SHAPES or alive(), timeout=900, every=1)
        wait_for(lambda: not cluster.queued(job), timeout=300, every=1)  # the array ended by itself (--once)
        tasks = cluster.tasks(job)
    finally:
        if job is not None:
            cluster.run("scancel", job, check=False)  # the launcher's stop
        launched.stop(svc)
    assert job is not None
    wait_for(lambda: not cluster.queued(job) and not slurm_cluster.processes_of(job), timeout=120, every=0.5)
    verdict = svc.verdict()
    out = outputs(tmp_path, job)
    states = {i: (t["JobState"], t["ExitCode"]) for i, t in sorted(tasks.items())}
    print(f"slurm array: {verdict}; cancelled task {task} mid-lease at {cancelled_at:.0f} s (lease {lease}: "
          f"{svc.lease_state(lease)}); tasks {states}; wall {time.monotonic() - t0:.0f} s")
    assert verdict["lost"] == 0 and verdict["twice"] == 0, verdict
    # SIGTERM: the worker finishes the shape it is on and releases the rest ('released'; 'done' when that shape
    # was the lease's last); mid-lease it was: the database showed one shape finished and one leased before
    assert svc.lease_state(lease) in ("released", "done", "expired"), svc.lease_state(lease)
    assert states[task][0] == "CANCELLED", states
    survivors = {i: s for i, s in states.items() if i != task}
    assert set(survivors.values()) == {("COMPLETED", "0:0")}, (states, out)
    assert all('"worker_id": "tuner-test-' in out[i] for i in survivors), out  # each ran and reported
    assert "signal 15: finishing the current shape and releasing the lease" in out[task], out[task]


def test_launch_slurm_refuses_what_it_cannot_run(tmp_path):
    tok = launched.token_file(tmp_path, "atk_x")
    r = launch(tmp_path, "127.0.0.1:8000", tok)
    assert r.returncode == 2 and "--service" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = launch(tmp_path, "http://127.0.0.1:8000", tok, "--runtime", "pyxis")
    assert r.returncode == 2 and "--image" in r.stderr, r.stderr
    r = launch(tmp_path, "http://127.0.0.1:8000", tok, "--env", "TUNER_TOKEN=atk_x")
    assert r.returncode == 2 and "--token-file" in r.stderr, r.stderr


def test_pyxis_pins_the_image_by_digest_and_mounts_the_token_file(tmp_path):
    tok = launched.token_file(tmp_path, "atk_secret")
    r = launch(tmp_path, "http://127.0.0.1:8000", tok, "--runtime", "pyxis", "--image", "rocm/vllm",
               "--wheelhouse", "/shared/wheelhouse", "--gpu-request=--gres=gpu:1")
    assert r.returncode == 0, r.stderr
    s = r.stdout
    assert f"--container-image=rocm/vllm@{DIGEST}" in s and "#SBATCH --gres=gpu:1" in s
    assert f"{tok}:/run/secrets/aiter-tuner-token:ro" in s and "/shared/wheelhouse:/opt/aiter-tuner/wheels:ro" in s
    assert "atk_secret" not in s and "TUNER_TOKEN_FILE=/run/secrets/aiter-tuner-token" in s
    assert "aiter-tuner-worker" in s and "-m workers" not in s
    subprocess.run(["bash", "-n"], input=s, text=True, check=True)  # bash parses it
