"""Pool manager: one worker container per GPU of a ROCm host, from the served image's digest (docker SDK).

The container cannot see its own image digest, so the manager passes it in (TUNER_IMAGE_DIGEST): the registry
digest from RepoDigests, or for a locally built image (no RepoDigests) its Id, the config's sha256 (a local build
is tuned under its Id; pushed, it gets a manifest digest and is another image to the service). Each container
gets /dev/kfd plus only its GPU's render node (or the whole /dev/dri pinned with HIP_VISIBLE_DEVICES), the
video/render groups by host GID, host IPC and a large /dev/shm, as ROCm's, vLLM's and SGLang's docker pages run
them; on a host without /dev/kfd (cpu_only) none of that, and the workers tune on the CPU.

The worker is installed into the served image at container start, never mounted from a checkout: BOOTSTRAP
makes a venv that sees the image's own site-packages (its torch, aiter, pydantic, httpx stay), installs this
project's wheel and the worker's own needs (tenacity, urllib3) from a wheelhouse mounted read-only, with
`--no-deps --no-index` (containers need no network), then execs the console script aiter-tuner-worker
(`python -m workers` breaks wherever the working directory holds an `app` package of its own). The token comes
from a file bind-mounted read-only (TUNER_TOKEN_FILE): never on a command line, in the environment or in
`docker inspect`. scripts/build_wheelhouse.sh builds the wheelhouse.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.launch.bootstrap import BOOTSTRAP, TOKEN_PATH, VENV, WHEELS  # noqa: F401  (re-exported)
from workers.settings import WorkerSettings

LABEL = "aiter-tuner.pool"


@dataclass
class PoolConfig:
    pool: str
    image: str  # repo@sha256:... or a tag; the digest is resolved from RepoDigests
    service_url: str
    gpus: list[int]
    budget_s: float = 300.0
    backend: str = "aiter"
    wheelhouse: str = "dist/wheelhouse"  # this project's wheel, tenacity, urllib3 (and pip): mounted at WHEELS
    token_file: str | None = None  # the worker token: mounted at TOKEN_PATH
    once: bool = False  # each worker exits 0 when nothing is queued or leased for it (then the pool is done)
    cpu_only: bool = False  # no /dev/kfd on this host: no GPU devices or groups, the workers tune on the CPU
    python: str = "python3"  # the served image's interpreter
    restart_retries: int = 3  # docker restarts a worker that failed (a crash, a kill by the OOM killer)
    shm_size: str = "16g"
    render_minors: dict[int, int] = field(default_factory=dict)  # gpu index -> /dev/dri/renderD minor
    pin_render_node: bool = True
    group_ids: list[int] = field(default_factory=list)  # host GIDs owning /dev/kfd and /dev/dri/*
    extra_env: dict[str, str] = field(default_factory=dict)


def host_device_gids(paths: tuple[str, ...] = ("/dev/kfd", "/dev/dri")) -> list[int]:
    """Numeric GIDs, since group names inside the image need not match the host's."""
    gids: set[int] = set()
    for p in paths:
        if os.path.isdir(p):
            gids |= {os.stat(os.path.join(p, f)).st_gid for f in os.listdir(p) if f.startswith("render")}
        elif os.path.exists(p):
            gids.add(os.stat(p).st_gid)
    return sorted(gids)


def resolve_digest(image_attrs: dict[str, Any], ref: str) -> str:
    """The registry manifest digest from RepoDigests; a local image falls back to its Id."""
    repo = _repository(ref)
    digests = [rd.partition("@") for rd in image_attrs.get("RepoDigests") or []]
    for name, _, digest in digests:
        if _repository(name) == repo:
            return digest
    return digests[0][2] if digests else image_attrs["Id"]


def _repository(ref: str) -> tuple[str, str]:
    """(registry, repository) of an image reference, as docker itself splits and normalises it
    (rocm/vllm:tag, docker.io/rocm/vllm@sha256:..., localhost:5000/x:tag)."""
    from docker.auth import resolve_repository_name
    from docker.utils import parse_repository_tag
    repo, _ = parse_repository_tag(ref)
    if "@" in ref and ":" in repo.rsplit("/", 1)[-1]:  # name:tag@digest: drop the tag too
        repo, _ = parse_repository_tag(repo)
    return resolve_repository_name(repo)


def kfd_render_minors(topology: str = "/sys/class/kfd/kfd/topology/nodes") -> dict[int, int]:
    """GPU index -> render minor from the KFD topology (reliable under MI300X partition modes)."""
    minors = []
    for node in sorted(Path(topology).glob("*"), key=lambda p: int(p.name) if p.name.isdigit() else 0):
        props = dict(line.split(" ", 1) for line in (node / "properties").read_text().splitlines() if " " in line)
        if int(props.get("simd_count", "0")) > 0:
            minors.append(int(props["drm_render_minor"]))
    return dict(enumerate(minors))


def container_kwargs(cfg: PoolConfig, gpu: int, digest: str) -> dict[str, Any]:
    worker = WorkerSettings(service_url=cfg.service_url, image_digest=digest, budget_s=cfg.budget_s,
                            backend=cfg.backend, worker_id=f"{cfg.pool}-gpu{gpu}", gpu=0, once=cfg.once,
                            token_file=TOKEN_PATH if cfg.token_file else None)
    env = {**worker.env("service_url", "image_digest", "budget_s", "backend", "worker_id", "once"),
           **cfg.extra_env}
    volumes = {os.path.abspath(cfg.wheelhouse): {"bind": WHEELS, "mode": "ro"}}
    if cfg.token_file:
        env.update(worker.env("token_file"))
        volumes[os.path.abspath(cfg.token_file)] = {"bind": TOKEN_PATH, "mode": "ro"}
    devices: list[str] = []
    if cfg.cpu_only:
        env.update(worker.env("gpu"))
    elif cfg.pin_render_node and gpu in cfg.render_minors:
        devices = ["/dev/kfd", f"/dev/dri/renderD{cfg.render_minors[gpu]}"]
        env.update(worker.env("gpu"))  # 0: the only GPU this container can see
    else:
        devices = ["/dev/kfd", "/dev/dri"]
        env.update(HIP_VISIBLE_DEVICES=str(gpu), ROCR_VISIBLE_DEVICES=str(gpu), **worker.env("gpu"))
    groups = [] if cfg.cpu_only else [str(g) for g in cfg.group_ids] or ["video"]
    return {
        "image": cfg.image, "command": [cfg.python, "-c", BOOTSTRAP], "detach": True,
        "name": f"aiter-tuner-{cfg.pool}-gpu{gpu}", "environment": env, "devices": devices,
        "group_add": groups, "ipc_mode": "host", "shm_size": cfg.shm_size,
        "security_opt": ["seccomp=unconfined"], "cap_add": ["SYS_PTRACE"], "network_mode": "host",
        "labels": {LABEL: cfg.pool, "aiter-tuner.gpu": str(gpu), "aiter-tuner.digest": digest},
        "volumes": volumes,
        # (docker reads a MaximumRetryCount of 0 as "no limit")
        "restart_policy": ({"Name": "on-failure", "MaximumRetryCount": cfg.restart_retries} if cfg.restart_retries > 0
                           else {"Name": "no"}),
    }


class PoolManager:
    def __init__(self, client: Any = None):
        if client is None:
            import docker
            client = docker.from_env()
        self.client = client

    def start(self, cfg: PoolConfig) -> list[str]:
        if not any(Path(cfg.wheelhouse).glob("aiter_tuner-*.whl")):
            raise FileNotFoundError(f"no aiter_tuner wheel in {cfg.wheelhouse} (scripts/build_wheelhouse.sh "
                                    "builds it)")
        if cfg.token_file and not os.path.isfile(cfg.token_file):
            raise FileNotFoundError(f"the token file {cfg.token_file} does not exist")
        image = self.client.images.get(cfg.image)
        digest = resolve_digest(image.attrs, cfg.image)
        return [self.client.containers.run(**container_kwargs(cfg, g, digest)).id for g in cfg.gpus]

    def list(self, pool: str) -> list[dict[str, str]]:
        return [{"id": c.id, "name": c.name, "status": c.status, "gpu": c.labels.get("aiter-tuner.gpu", "")}
                for c in self.client.containers.list(all=True, filters={"label": f"{LABEL}={pool}"})]

    def stop(self, pool: str, timeout_s: int = 60) -> int:
        """SIGTERM first: the agent finishes or abandons its shape and releases the lease."""
        cs = self.client.containers.list(all=True, filters={"label": f"{LABEL}={pool}"})
        for c in cs:
            c.stop(timeout=timeout_s)
            c.remove(force=True)  # one docker restarted meanwhile (on-failure) goes too
        return len(cs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workers.pool")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start")
    s.add_argument("--pool", required=True)
    s.add_argument("--image", required=True)
    s.add_argument("--service", required=True)
    s.add_argument("--gpus", default="0", help="comma-separated GPU indices")
    s.add_argument("--budget-s", type=float, default=300.0)
    s.add_argument("--backend", default="aiter")
    s.add_argument("--token-file", default=os.environ.get("TUNER_TOKEN_FILE"),
                   help="a file holding the worker token (default: TUNER_TOKEN_FILE); mounted read-only into each "
                        "container, never passed on a command line or in its environment")
    s.add_argument("--wheelhouse", default="dist/wheelhouse",
                   help="this project's wheel plus tenacity, urllib3 and pip (scripts/build_wheelhouse.sh)")
    s.add_argument("--once", action="store_true", help="each worker exits when nothing is queued or leased for it")
    s.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="more worker settings, e.g. TUNER_RACE=exhaustive (repeatable)")
    s.add_argument("--restart-retries", type=int, default=3,
                   help="docker restarts a worker that fails this many times (0: never)")
    for name in ("list", "stop"):
        sub.add_parser(name).add_argument("--pool", required=True)
    args = p.parse_args(argv)
    mgr = PoolManager()
    if args.cmd == "start":
        cpu_only = not os.path.exists("/dev/kfd")
        if cpu_only:
            print("no /dev/kfd on this host: the containers get no GPU devices and tune on the CPU", file=sys.stderr)
        extra = dict(e.split("=", 1) for e in args.env)
        cfg = PoolConfig(args.pool, args.image, args.service, [int(g) for g in args.gpus.split(",")],
                         args.budget_s, args.backend, wheelhouse=args.wheelhouse, token_file=args.token_file,
                         once=args.once, cpu_only=cpu_only, restart_retries=args.restart_retries, extra_env=extra,
                         group_ids=host_device_gids(),
                         render_minors=kfd_render_minors() if os.path.isdir("/sys/class/kfd") else {})
        try:
            print(json.dumps(mgr.start(cfg)))
        except FileNotFoundError as e:
            print(f"pool start: error: {e}", file=sys.stderr)
            return 2
    elif args.cmd == "list":
        print(json.dumps(mgr.list(args.pool), indent=1))
    else:
        print(mgr.stop(args.pool))
    return 0


if __name__ == "__main__":
    sys.exit(main())
