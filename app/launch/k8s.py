"""`aiter-tuner launch k8s`: Kubernetes manifests for the workers and the service.

- workers-job.yaml: a work-queue Job (parallelism = GPUs, completions unset: the Job is done once its pods have
  ended and one succeeded). Each pod runs one worker with --once on one GPU (`amd.com/gpu: 1`, AMD's device
  plugin), which exits 0 when nothing is queued for its identity; the lease protocol is the queue (heartbeats,
  expiry, idempotent results), so a pod that dies loses nothing: its leases expire and go back to the queue.
- workers-scaledjob.yaml (--keda): the same pod as a KEDA ScaledJob sized by the service's demand
  (GET /v1/demand: estimated GPU seconds queued for this identity), one Job of one worker per `--keda-gpu-s`.
- service.yaml: the service (Deployment, Service) on PostgreSQL, DATABASE_URL from a Secret; postgres.yaml: a
  single-replica PostgreSQL StatefulSet (--external-postgres: none, point database-url at yours);
  secrets.template.yaml: the Secrets they read, with placeholders (or make them with kubectl create secret).

The served image is pinned by digest (repo@sha256:...): the digest is the campaign's identity, and a tag can move.
The worker runs from this project's wheel (a ConfigMap, `kubectl create configmap aiter-tuner-wheel
--from-file=dist/<wheel>`), installed at pod start with --no-deps into a venv with the image's site-packages, so
the image's torch and aiter stay what they are. The worker's token is a Secret mounted as a file
(TUNER_TOKEN_FILE), never a literal or an argument. Nothing here talks to a cluster: tests validate every manifest
against the official schemas of two Kubernetes minor releases (kubernetes-validate, offline).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORKER_SECRET, SERVICE_SECRET, SCALER_SECRET = "aiter-tuner-worker", "aiter-tuner", "aiter-tuner-scaler"
WHEEL_CONFIGMAP = "aiter-tuner-wheel"
TOKEN_DIR = "/var/run/secrets/aiter-tuner"
VENV = "/opt/aiter-tuner"
KUEUE_LABEL = "kueue.x-k8s.io/queue-name"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@dataclass(frozen=True)
class Options:
    image: str  # repository, no tag, no digest
    digest: str  # sha256:<64 hex>
    gpus: int
    namespace: str = "aiter-tuner"
    service_url: str | None = None  # default: this namespace's Service
    backend: str = "aiter"
    budget_s: float = 300.0
    queue: str | None = None  # Kueue LocalQueue
    gfx: str | None = None  # the GPUs' identity: the demand filter of the ScaledJob
    cu_num: int | None = None
    keda: bool = False
    keda_gpu_s: float = 3600.0  # one worker Job per this many estimated GPU seconds queued
    service: bool = True
    external_postgres: bool = False
    service_image: str = "python:3.11-slim"
    service_installed: bool = False  # service_image already has aiter-tuner[postgres]
    service_replicas: int = 1

    @property
    def pinned(self) -> str:
        return f"{self.image}@{self.digest}"

    @property
    def url(self) -> str:
        return self.service_url or f"http://aiter-tuner.{self.namespace}.svc:8000"

    @property
    def short(self) -> str:
        return self.digest.split(":")[1][:12]


def pin(image: str, digest: str | None) -> tuple[str, str]:
    """(repository, digest) from IMAGE[:TAG][@sha256:D] and/or --image-digest; a digest is required and both, when
    given, must agree. The tag goes: the digest is what runs."""
    repo, _, in_ref = image.partition("@")
    if in_ref and not _DIGEST.fullmatch(in_ref):
        raise ValueError(f"--image: {in_ref!r} is not sha256:<64 lowercase hex>")
    if digest is not None and not _DIGEST.fullmatch(digest):
        raise ValueError(f"--image-digest: {digest!r} is not sha256:<64 lowercase hex>")
    if in_ref and digest and in_ref != digest:
        raise ValueError(f"--image names {in_ref} but --image-digest says {digest}")
    d = in_ref or digest
    if not d:
        raise ValueError("the image must be pinned: --image REPO@sha256:<digest> or --image-digest "
                         "(the digest is the campaign's identity; a tag can move)")
    last = repo.rsplit("/", 1)[-1]
    if ":" in last:  # a tag (a registry's :port is before the last /)
        repo = repo[: len(repo) - len(last)] + last.split(":", 1)[0]
    if not repo:
        raise ValueError("--image: no repository")
    return repo, d


def _labels(o: Options, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "aiter-tuner", "app.kubernetes.io/component": component}


def _meta(o: Options, name: str, component: str, **labels: str) -> dict[str, Any]:
    return {"name": name, "namespace": o.namespace, "labels": {**_labels(o, component), **labels}}


def _install_step(o: Options) -> dict[str, Any]:
    """An initContainer of the served image: this project's wheel into a venv that sees the image's packages
    (--system-site-packages), --no-deps so torch and aiter stay the image's; the worker extra's own packages
    (tenacity, urllib3) only where the image lacks them, into the venv, never over the image's."""
    script = (f"set -e; python3 -m venv --system-site-packages {VENV}; "
              f"{VENV}/bin/pip install -q --no-deps /wheels/aiter_tuner-*.whl; "
              f"{VENV}/bin/python -c 'import tenacity, urllib3' 2>/dev/null || "
              f"{VENV}/bin/pip install -q 'tenacity>=8.2' 'urllib3>=2'")
    return {"name": "install-aiter-tuner", "image": o.pinned, "command": ["sh", "-c", script],
            "volumeMounts": [{"name": "wheels", "mountPath": "/wheels", "readOnly": True},
                             {"name": "venv", "mountPath": VENV}]}


def worker_pod(o: Options, labels: dict[str, str]) -> dict[str, Any]:
    env = [{"name": "TUNER_SERVICE_URL", "value": o.url},
           {"name": "TUNER_IMAGE_DIGEST", "value": o.digest},
           {"name": "TUNER_BACKEND", "value": o.backend},
           {"name": "TUNER_BUDGET_S", "value": f"{o.budget_s:g}"},
           {"name": "TUNER_TOKEN_FILE", "value": f"{TOKEN_DIR}/token"},  # a file, never the token itself
           {"name": "TUNER_SPOOL_DIR", "value": "/spool"},
           {"name": "PYTHONUNBUFFERED", "value": "1"}]
    return {
        "metadata": {"labels": labels},
        "spec": {
            # OnFailure: a crashed worker restarts in the same pod, and its spool (emptyDir) with it: the results
            # it finished are delivered by the next start
            "restartPolicy": "OnFailure",
            "initContainers": [_install_step(o)],
            "containers": [{
                "name": "worker", "image": o.pinned,
                # --once: exits 0 when nothing is queued for this GPU's identity, so the Job completes
                "command": [f"{VENV}/bin/aiter-tuner-worker", "--once"],
                "env": env,
                "resources": {"limits": {"amd.com/gpu": 1}},
                "volumeMounts": [{"name": "venv", "mountPath": VENV},
                                 {"name": "token", "mountPath": TOKEN_DIR, "readOnly": True},
                                 {"name": "spool", "mountPath": "/spool"},
                                 {"name": "dshm", "mountPath": "/dev/shm"}]}],
            "volumes": [{"name": "wheels", "configMap": {"name": WHEEL_CONFIGMAP}},
                        {"name": "venv", "emptyDir": {}},
                        {"name": "token", "secret": {"secretName": WORKER_SECRET, "defaultMode": 0o400,
                                                     "items": [{"key": "token", "path": "token"}]}},
                        {"name": "spool", "emptyDir": {}},
                        {"name": "dshm", "emptyDir": {"medium": "Memory"}}]}}


def workers_job(o: Options) -> dict[str, Any]:
    extra = {KUEUE_LABEL: o.queue} if o.queue else {}
    labels = {**_labels(o, "worker"), "aiter-tuner/image": o.short}
    spec: dict[str, Any] = {
        "parallelism": o.gpus,  # one pod per GPU; completions unset: a work queue
        "backoffLimit": max(6, 2 * o.gpus),
        "ttlSecondsAfterFinished": 86400,
        "template": worker_pod(o, labels)}
    if o.queue:
        spec["suspend"] = True  # Kueue admits it (unsuspends) when its ClusterQueue has the GPUs
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": _meta(o, f"aiter-tuner-workers-{o.short}", "worker", **extra), "spec": spec}


def scaled_job(o: Options) -> list[dict[str, Any]]:
    """KEDA: a Job of one worker per `keda_gpu_s` estimated GPU seconds queued for this identity, at most one per
    GPU. `accurate`: the demand counts queued shapes only (leased ones are the running jobs' work), so KEDA
    subtracts nothing more for running jobs than it must."""
    query = f"image_digest={o.digest}&gfx={o.gfx}&cu_num={o.cu_num}"
    labels = {**_labels(o, "worker"), "aiter-tuner/image": o.short}
    extra = {KUEUE_LABEL: o.queue} if o.queue else {}
    template = worker_pod(o, {**labels, **extra})
    return [
        {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledJob",
         "metadata": _meta(o, f"aiter-tuner-workers-{o.short}", "worker", **extra),
         "spec": {
             "jobTargetRef": {"parallelism": 1, "completions": 1, "backoffLimit": 4, "template": template},
             "pollingInterval": 30, "minReplicaCount": 0, "maxReplicaCount": o.gpus,
             "successfulJobsHistoryLimit": 5, "failedJobsHistoryLimit": 5,
             "scalingStrategy": {"strategy": "accurate"},
             "triggers": [{
                 "type": "metrics-api",
                 "metadata": {"url": f"{o.url}/v1/demand?{query}", "format": "json",
                              "valueLocation": "total.gpu_s_queued_est", "targetValue": f"{o.keda_gpu_s:g}",
                              "authMode": "bearer"},
                 "authenticationRef": {"name": SCALER_SECRET}}]}},
        {"apiVersion": "keda.sh/v1alpha1", "kind": "TriggerAuthentication",
         "metadata": _meta(o, SCALER_SECRET, "scaler"),
         "spec": {"secretTargetRef": [{"parameter": "token", "name": SCALER_SECRET, "key": "token"}]}},
    ]


def service(o: Options) -> list[dict[str, Any]]:
    if o.service_installed:
        cmd = "exec aiter-tuner serve --host 0.0.0.0 --port 8000"
    else:  # the wheel from the ConfigMap, with its [postgres] extra from the package index (or PIP_INDEX_URL)
        cmd = (f"set -e; python3 -m venv {VENV}; {VENV}/bin/pip install -q \"$(ls /wheels/aiter_tuner-*.whl)"
               f"[postgres]\"; exec {VENV}/bin/aiter-tuner serve --host 0.0.0.0 --port 8000")
    probe = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5}
    container: dict[str, Any] = {
        "name": "service", "image": o.service_image, "command": ["sh", "-c", cmd],
        "ports": [{"name": "http", "containerPort": 8000}],
        "env": [{"name": "DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": SERVICE_SECRET,
                                                                        "key": "database-url"}}},
                # the bootstrap admin token while the database has none (README: Tokens)
                {"name": "TUNER_ADMIN_TOKEN", "valueFrom": {"secretKeyRef": {"name": SERVICE_SECRET,
                                                                             "key": "admin-token"}}},
                {"name": "TUNER_ADMIN_TOKEN_FILE", "value": "/tmp/admin_token"}],
        # a start migrates the database first (replicas wait on a lock): give it time before liveness counts
        "startupProbe": {**probe, "failureThreshold": 120},
        "readinessProbe": probe, "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}
    volumes: list[dict[str, Any]] = []
    if not o.service_installed:
        container["volumeMounts"] = [{"name": "wheels", "mountPath": "/wheels", "readOnly": True}]
        volumes = [{"name": "wheels", "configMap": {"name": WHEEL_CONFIGMAP}}]
    labels = _labels(o, "service")
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(o, "aiter-tuner", "service"),
         "spec": {"replicas": o.service_replicas, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels},
                               "spec": {"containers": [container], "volumes": volumes}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta(o, "aiter-tuner", "service"),
         "spec": {"selector": labels, "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]}},
    ]


def postgres(o: Options) -> list[dict[str, Any]]:
    labels = _labels(o, "postgres")
    env = [{"name": "POSTGRES_USER", "value": "tuner"}, {"name": "POSTGRES_DB", "value": "tuner"},
           {"name": "POSTGRES_PASSWORD", "valueFrom": {"secretKeyRef": {"name": SERVICE_SECRET,
                                                                        "key": "postgres-password"}}},
           {"name": "PGDATA", "value": "/var/lib/postgresql/data/pgdata"}]
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta(o, "aiter-tuner-postgres", "postgres"),
         "spec": {"clusterIP": "None", "selector": labels, "ports": [{"name": "pg", "port": 5432}]}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _meta(o, "aiter-tuner-postgres", "postgres"),
         "spec": {"serviceName": "aiter-tuner-postgres", "replicas": 1, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": {"containers": [{
                      "name": "postgres", "image": "postgres:16", "env": env,
                      "ports": [{"name": "pg", "containerPort": 5432}],
                      "readinessProbe": {"exec": {"command": ["pg_isready", "-U", "tuner"]}, "periodSeconds": 5},
                      "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"}]}]}},
                  "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                      "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "20Gi"}}}}]}},
    ]


def secrets(o: Options) -> list[dict[str, Any]]:
    """Templates: fill the <...> values (or `kubectl create secret generic ...` with the same keys); the worker's
    and the scaler's tokens are made by the service, once it runs (README: From zero to production)."""
    db = ("postgresql://tuner:<postgres-password>@aiter-tuner-postgres:5432/tuner" if not o.external_postgres
          else "postgresql://<user>:<password>@<your PostgreSQL host>:5432/<database>")
    svc = {"database-url": db, "admin-token": "<a long random string: the bootstrap admin token>"}
    if not o.external_postgres:
        svc["postgres-password"] = "<postgres-password>"
    out = [{"apiVersion": "v1", "kind": "Secret", "metadata": _meta(o, SERVICE_SECRET, "service"),
            "type": "Opaque", "stringData": svc},
           {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(o, WORKER_SECRET, "worker"), "type": "Opaque",
            "stringData": {"token": f"<aiter-tuner token create --role worker --name k8s --digest {o.digest}>"}}]
    if o.keda:
        out.append({"apiVersion": "v1", "kind": "Secret", "metadata": _meta(o, SCALER_SECRET, "scaler"),
                    "type": "Opaque",
                    "stringData": {"token": f"<aiter-tuner token create --role read --name keda --digest {o.digest}>"}})
    return out


def render(o: Options) -> dict[str, list[dict[str, Any]]]:
    """File name -> its documents."""
    if o.gpus < 1:
        raise ValueError("--gpus: at least 1")
    if o.queue is not None and not (len(o.queue) <= 63 and _NAME.fullmatch(o.queue)):
        raise ValueError(f"--queue: {o.queue!r} is not a Kueue LocalQueue name (a DNS label)")
    if o.keda and (not o.gfx or not o.cu_num):
        raise ValueError("--keda needs --gfx and --cu-num: the identity whose demand sizes the workers "
                         "(gfx942 and 304 on an MI300X)")
    files = {"secrets.template.yaml": secrets(o)}
    if o.service:
        if not o.external_postgres:
            files["postgres.yaml"] = postgres(o)
        files["service.yaml"] = service(o)
    files["workers-job.yaml"] = [workers_job(o)]
    if o.keda:
        files["workers-scaledjob.yaml"] = scaled_job(o)
    return files


def dump(docs: list[dict[str, Any]]) -> str:
    """YAML documents (PyYAML where installed; else JSON, which is YAML and what kubectl reads as well)."""
    try:
        import yaml
    except ImportError:
        return "".join(f"---\n{json.dumps(d, indent=2)}\n" for d in docs)
    return "".join("---\n" + yaml.safe_dump(d, sort_keys=False, width=120) for d in docs)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--image", required=True,
                   help="the served image (vLLM/SGLang with AITER), pinned: REPO@sha256:<digest>, or REPO[:TAG] "
                        "with --image-digest")
    p.add_argument("--image-digest", help="sha256:<64 hex>, where --image has no @digest")
    p.add_argument("--gpus", type=int, required=True, help="how many GPUs to tune on: the Job's parallelism")
    p.add_argument("--namespace", default="aiter-tuner")
    p.add_argument("--service-url", help="the service as the pods reach it (default: this namespace's Service)")
    p.add_argument("--backend", choices=("aiter", "torch"), default="aiter")
    p.add_argument("--budget-s", type=float, default=300.0, help="a leased batch's time budget")
    p.add_argument("--queue", help=f"a Kueue LocalQueue: the {KUEUE_LABEL} label on the Job, created suspended")
    p.add_argument("--gfx", help="the GPUs' gfx (gfx942, gfx950): with --keda, whose queued demand scales the Job")
    p.add_argument("--cu-num", type=int, help="their compute units (304 on an MI300X, 256 on an MI355X)")
    p.add_argument("--keda", action="store_true", help="also a KEDA ScaledJob sized by GET /v1/demand")
    p.add_argument("--keda-gpu-s", type=float, default=3600.0,
                   help="one worker Job per this many estimated GPU seconds queued (default: an hour)")
    p.add_argument("--no-service", action="store_true", help="workers only (the service runs elsewhere)")
    p.add_argument("--external-postgres", action="store_true",
                   help="no PostgreSQL StatefulSet: database-url in the Secret names yours")
    p.add_argument("--service-image", default="python:3.11-slim",
                   help="the service's image (default: python:3.11-slim, which installs the wheel at start)")
    p.add_argument("--service-installed", action="store_true",
                   help="--service-image already has aiter-tuner[postgres] (no install at start, no index)")
    p.add_argument("--service-replicas", type=int, default=1)
    p.add_argument("--out", help="write one file per part into this folder (default: every document to stdout)")


def main(args: argparse.Namespace) -> int:
    try:
        repo, digest = pin(args.image, args.image_digest)
        files = render(Options(
            image=repo, digest=digest, gpus=args.gpus, namespace=args.namespace, service_url=args.service_url,
            backend=args.backend, budget_s=args.budget_s, queue=args.queue, gfx=args.gfx, cu_num=args.cu_num,
            keda=args.keda, keda_gpu_s=args.keda_gpu_s, service=not args.no_service,
            external_postgres=args.external_postgres, service_image=args.service_image,
            service_installed=args.service_installed, service_replicas=args.service_replicas))
    except ValueError as e:
        print(f"aiter-tuner launch k8s: {e}", file=sys.stderr)
        return 2
    if args.out is None:
        sys.stdout.write("".join(dump(docs) for docs in files.values()))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, docs in files.items():
        (out / name).write_text(dump(docs))
        print(out / name)
    return 0
