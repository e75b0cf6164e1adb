"""Pool manager: one worker container per GPU of a ROCm host, from the served image's digest (docker SDK).

The container cannot see its own image digest, so the manager passes it in (TUNER_IMAGE_DIGEST). Each
container gets /dev/kfd plus only its GPU's render node (or the whole /dev/dri pinned with
HIP_VISIBLE_DEVICES), the video/render groups by host GID, host IPC and a large /dev/shm, as ROCm's,
vLLM's and SGLang's docker pages run them. The agent is mounted read-only from the host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    agent_dir: str = str(Path(__file__).resolve().parents[1])  # this checkout: mounted at /opt/aiter-tuner
    shm_size: str = "16g"
    render_minors: dict[int, int] = field(default_factory=dict)  # gpu index -> /dev/dri/renderD minor
    pin_render_node: bool = True
    group_ids: list[int] = field(default_factory=list)  # host GIDs owning /dev/kfd and /dev/dri/*
    token: str | None = None
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
                            backend=cfg.backend, worker_id=f"{cfg.pool}-gpu{gpu}", gpu=0, token=cfg.token)
    env = {**worker.env("service_url", "image_digest", "budget_s", "backend", "worker_id"),
           "PYTHONPATH": "/opt/aiter-tuner", **cfg.extra_env}
    if cfg.token:
        env.update(worker.env("token"))
    if cfg.pin_render_node and gpu in cfg.render_minors:
        devices = ["/dev/kfd", f"/dev/dri/renderD{cfg.render_minors[gpu]}"]
        env.update(worker.env("gpu"))  # 0: the only GPU this container can see
    else:
        devices = ["/dev/kfd", "/dev/dri"]
        env.update(HIP_VISIBLE_DEVICES=str(gpu), ROCR_VISIBLE_DEVICES=str(gpu), **worker.env("gpu"))
    return {
        "image": cfg.image, "command": ["python3", "-m", "workers"], "detach": True,
        "name": f"aiter-tuner-{cfg.pool}-gpu{gpu}", "environment": env, "devices": devices,
        "group_add": [str(g) for g in cfg.group_ids] or ["video"], "ipc_mode": "host", "shm_size": cfg.shm_size,
        "security_opt": ["seccomp=unconfined"], "cap_add": ["SYS_PTRACE"], "network_mode": "host",
        "labels": {LABEL: cfg.pool, "aiter-tuner.gpu": str(gpu), "aiter-tuner.digest": digest},
        "volumes": {cfg.agent_dir: {"bind": "/opt/aiter-tuner", "mode": "ro"}},
        "restart_policy": {"Name": "on-failure", "MaximumRetryCount": 3},
    }


class PoolManager:
    def __init__(self, client: Any = None):
        if client is None:
            import docker
            client = docker.from_env()
        self.client = client

    def start(self, cfg: PoolConfig) -> list[str]:
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
            c.remove()
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
    for name in ("list", "stop"):
        sub.add_parser(name).add_argument("--pool", required=True)
    args = p.parse_args(argv)
    mgr = PoolManager()
    if args.cmd == "start":
        cfg = PoolConfig(args.pool, args.image, args.service, [int(g) for g in args.gpus.split(",")],
                         args.budget_s, args.backend, group_ids=host_device_gids(),
                         render_minors=kfd_render_minors() if os.path.isdir("/sys/class/kfd") else {})
        print(json.dumps(mgr.start(cfg)))
    elif args.cmd == "list":
        print(json.dumps(mgr.list(args.pool), indent=1))
    else:
        print(mgr.stop(args.pool))
    return 0


if __name__ == "__main__":
    sys.exit(main())
