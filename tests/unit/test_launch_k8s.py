"""`aiter-tuner launch k8s`: the manifests as rendered for a digest, and every one validated against the official
schemas of the current and the previous Kubernetes minor release that kubernetes-validate ships (offline: no
kube-apiserver can run here). KEDA's ScaledJob and TriggerAuthentication are CRDs that package does not ship: their
structure is checked here, and the ScaledJob's jobTargetRef (a batch/v1 JobSpec) against the official Job schema."""

from __future__ import annotations

import subprocess

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions
from packaging.version import Version

from app.launch import k8s
from tests.conftest import ROOT, console_script

DIGEST = "sha256:" + "ab" * 32
REPO = "registry.example:5000/rocm/vllm"


def two_minor_releases() -> list[str]:
    """The newest patch of the two newest minor releases the installed kubernetes-validate has schemas for."""
    by_minor: dict[tuple[int, int], str] = {}
    for v in all_versions():
        key = Version(v).release[:2]
        if key not in by_minor or Version(v) > Version(by_minor[key]):
            by_minor[key] = v
    return [by_minor[k] for k in sorted(by_minor)[-2:]]


RELEASES = two_minor_releases()


def rendered(**over) -> dict[str, list[dict]]:
    repo, digest = k8s.pin(f"{REPO}:v0.9@{DIGEST}", None)
    opts = dict(image=repo, digest=digest, gpus=8, queue="team-a", keda=True, gfx="gfx942", cu_num=304)
    opts.update(over)
    return k8s.render(k8s.Options(**opts))


def docs(files=None):
    return [d for ds in (files or rendered()).values() for d in ds]


def pods(files):
    """Every pod spec: the Job's, the Deployment's, the StatefulSet's and the ScaledJob's."""
    for d in docs(files):
        spec = d.get("spec", {})
        spec = spec.get("jobTargetRef", spec)
        if "template" in spec:
            yield d, spec["template"]["spec"]


def test_two_releases_are_validated():
    assert len(RELEASES) == 2 and Version(RELEASES[0]).release[:2] < Version(RELEASES[1]).release[:2]


def test_the_worker_job_pins_the_image_asks_one_gpu_reads_its_token_from_a_secret_and_carries_the_queue():
    files = rendered()
    (job,) = files["workers-job.yaml"]
    assert job["kind"] == "Job" and job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["parallelism"] == 8 and "completions" not in job["spec"]  # a work queue
    assert job["spec"]["suspend"] is True  # Kueue admits it
    pod = job["spec"]["template"]["spec"]
    (worker,) = pod["containers"]
    pinned = f"{REPO}@{DIGEST}"  # the tag dropped: the digest is what runs
    assert worker["image"] == pinned and [c["image"] for c in pod["initContainers"]] == [pinned]
    assert worker["resources"]["limits"] == {"amd.com/gpu": 1}
    assert worker["command"][-2:] == ["/opt/aiter-tuner/bin/aiter-tuner-worker", "--once"]
    env = {e["name"]: e for e in worker["env"]}
    assert env["TUNER_IMAGE_DIGEST"]["value"] == DIGEST and "TUNER_TOKEN" not in env
    token_file = env["TUNER_TOKEN_FILE"]["value"]
    mount = next(m for m in worker["volumeMounts"] if token_file.startswith(m["mountPath"] + "/"))
    vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert vol["secret"]["secretName"] == k8s.WORKER_SECRET and mount["readOnly"]
    assert token_file.endswith("/" + vol["secret"]["items"][0]["path"])
    install = pod["initContainers"][0]["command"][-1]
    assert "venv --system-site-packages" in install and "--no-deps /wheels/aiter_tuner-" in install
    assert not any("python -m workers" in str(c.get("command")) for c in pod["containers"] + pod["initContainers"])


def test_no_token_is_ever_a_literal_in_a_pod():
    """Tokens come from Secrets: as a mounted file (the worker) or valueFrom (the service's bootstrap admin)."""
    seen = 0
    for d, pod in pods(rendered()):
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            assert "TOKEN" not in " ".join(c.get("command", []) + c.get("args", [])), (d["kind"], c)
            for e in c.get("env", []):
                if "TOKEN" in e["name"]:
                    seen += 1
                    assert e["name"].endswith("_FILE") or "secretKeyRef" in e["valueFrom"], (d["kind"], e)
    assert seen >= 4  # the Job's and the ScaledJob's token files, the service's admin token and its file


def test_the_service_runs_on_postgresql_from_a_secret():
    files = rendered()
    dep, svc = files["service.yaml"]
    env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": k8s.SERVICE_SECRET, "key": "database-url"}
    assert svc["kind"] == "Service" and svc["spec"]["ports"][0]["port"] == 8000
    kinds = [d["kind"] for d in files["postgres.yaml"]]
    assert kinds == ["Service", "StatefulSet"]
    secret_keys = {d["metadata"]["name"]: set(d["stringData"]) for d in files["secrets.template.yaml"]}
    assert secret_keys[k8s.SERVICE_SECRET] == {"database-url", "admin-token", "postgres-password"}
    assert secret_keys[k8s.WORKER_SECRET] == {"token"} and secret_keys[k8s.SCALER_SECRET] == {"token"}
    ext = rendered(external_postgres=True)
    assert "postgres.yaml" not in ext
    assert "postgres-password" not in ext["secrets.template.yaml"][0]["stringData"]


def test_the_scaledjob_is_sized_by_the_demand_of_its_identity():
    sj, auth = rendered(keda_gpu_s=1800)["workers-scaledjob.yaml"]
    assert (sj["apiVersion"], sj["kind"], auth["kind"]) == ("keda.sh/v1alpha1", "ScaledJob", "TriggerAuthentication")
    spec = sj["spec"]
    assert spec["maxReplicaCount"] == 8 and spec["scalingStrategy"] == {"strategy": "accurate"}
    (trig,) = spec["triggers"]
    assert trig["type"] == "metrics-api" and trig["authenticationRef"] == {"name": auth["metadata"]["name"]}
    meta = trig["metadata"]
    assert set(meta) == {"url", "format", "valueLocation", "targetValue", "authMode"}
    assert meta["url"] == (f"http://aiter-tuner.aiter-tuner.svc:8000/v1/demand?image_digest={DIGEST}"
                           "&gfx=gfx942&cu_num=304")
    assert (meta["format"], meta["valueLocation"], meta["targetValue"], meta["authMode"]) == (
        "json", "total.gpu_s_queued_est", "1800", "bearer")
    assert all(isinstance(v, str) for v in meta.values())  # KEDA's trigger metadata is map[string]string
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "token", "name": k8s.SCALER_SECRET, "key": "token"}]
    job = spec["jobTargetRef"]
    assert job["parallelism"] == job["completions"] == 1
    worker = job["template"]["spec"]["containers"][0]
    assert worker["image"] == f"{REPO}@{DIGEST}" and worker["resources"]["limits"] == {"amd.com/gpu": 1}
    assert job["template"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    with pytest.raises(ValueError, match="--gfx and --cu-num"):
        rendered(gfx=None)


@pytest.mark.parametrize("release", RELEASES)
def test_every_manifest_passes_the_official_schema(release):
    checked = 0
    for d in docs() + docs(rendered(external_postgres=True, queue=None, keda=False, service_installed=True)):
        if d["apiVersion"].startswith("keda.sh/"):
            if d["kind"] != "ScaledJob":
                continue
            # its jobTargetRef is a batch/v1 JobSpec: the official schema decides it
            d = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "jobtargetref"},
                 "spec": d["spec"]["jobTargetRef"]}
        kubernetes_validate.validate(d, release, strict=True)  # raises ValidationError naming the field
        checked += 1
    assert checked >= 12


def test_the_validation_bites():
    (job,) = rendered()["workers-job.yaml"]
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["limit"] = {"amd.com/gpu": 1}  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, RELEASES[-1], strict=True)


def test_pinning_refuses_an_unpinned_or_contradictory_image():
    assert k8s.pin("rocm/vllm:latest", DIGEST) == ("rocm/vllm", DIGEST)
    assert k8s.pin("localhost:5000/vllm", DIGEST) == ("localhost:5000/vllm", DIGEST)
    for image, digest, why in (("rocm/vllm:latest", None, "must be pinned"),
                               (f"rocm/vllm@{DIGEST}", "sha256:" + "cd" * 32, "but --image-digest says"),
                               ("rocm/vllm@sha256:abc", None, "--image")):
        with pytest.raises(ValueError, match=why):
            k8s.pin(image, digest)


def test_the_cli_writes_the_files_and_refuses_an_unpinned_image(tmp_path):
    cli = console_script("aiter-tuner")
    r = subprocess.run([cli, "launch", "k8s", "--image", f"rocm/vllm@{DIGEST}", "--gpus", "2", "--out",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["postgres.yaml", "secrets.template.yaml", "service.yaml",
                                                           "workers-job.yaml"]
    (job,) = yaml.safe_load_all((tmp_path / "workers-job.yaml").read_text())
    assert job["spec"]["parallelism"] == 2 and "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]
    r = subprocess.run([cli, "launch", "k8s", "--image", "rocm/vllm:latest", "--gpus", "2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "must be pinned" in r.stderr and "Traceback" not in r.stderr
