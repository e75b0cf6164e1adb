"""aiter-tuner-worker: one agent per GPU, inside the served image's container.

Exit status: 0 when stopped by a signal or, with --once, when nothing is queued or leased for it; 2 for bad settings (a
service URL without http(s)://, a malformed --image-digest, an unreadable token file); 3 for a permanent error
from the service (a missing or refused token, a wrong role): each with a one-line reason on stderr.

This module imports only the standard library at its top: main() holds SIGTERM before anything heavy (pydantic,
httpx, torch) is imported, so a worker stopped while it starts (a pod deleted, a pool stopped, `scancel`) exits
0 like one stopped mid-run, instead of dying of the signal's default action."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.backends.base import Backend
    from workers.client import ServiceClient
    from workers.settings import WorkerSettings



def make_backend(cfg: WorkerSettings, device: str, llc_bytes: int | None = None) -> Backend:
    if cfg.backend == "torch":
        from workers.backends.torch_race import TorchBackend
        return TorchBackend(device=device, repeats=cfg.repeats, candidate_limit_s=cfg.candidate_limit_s,
                            race=cfg.race, min_improvement_pct=cfg.min_improvement_pct, llc_bytes=llc_bytes,
                            mem_cap_bytes=int(cfg.mem_cap_gib * (1 << 30)) if cfg.mem_cap_gib else None)
    from workers.backends.aiter_tuner import AiterBackend
    return AiterBackend(root=Path(cfg.aiter_root) if cfg.aiter_root else None, two_phase=cfg.race == "halving",
                        min_improvement_pct=cfg.min_improvement_pct, replay=device.startswith("cuda"),
                        device=device, llc_bytes=llc_bytes)


def report_image_tables(client: ServiceClient, cfg: WorkerSettings, digest: str) -> None:
    """Tell the service this image's own AITER tables and version, so outputs follow its headers."""
    from app import aiter_install
    from workers import image_tables
    pkg = Path(cfg.aiter_package) if cfg.aiter_package else aiter_install.aiter_package_dir()
    from workers.client import Fatal
    if pkg is None or not (pkg / "configs").is_dir():
        logging.info("no AITER package here: not reporting image tables")
        return
    try:
        stored = image_tables.report(client, digest, pkg, cfg.aiter_commit)
        logging.info("reported the image's AITER tables: %s", stored)
    except Exception as e:  # the service keeps the family defaults; tuning can go on
        if isinstance(e, Fatal):  # a refused token: tuning cannot go on either
            raise
        logging.warning("could not report the image's AITER tables: %s", e)


def report_kernel_catalog(client: ServiceClient, digest: str, backend: object) -> None:
    """The kernels this backend may race, per family, so the service refuses a winner outside them and an upgrade
    knows a kernel gone. The aiter backend reports the families whose every candidate list the image's AITER
    holds (TableFamily.catalog_lists); the service checks only what is reported."""
    from workers.backends.base import KernelCatalog
    from workers.client import Fatal
    if not isinstance(backend, KernelCatalog):
        return
    try:
        client.put_tables(digest, {"tables": {}, "kernels": backend.kernel_catalog()})
    except Exception as e:  # unchecked winners until the next start; tuning goes on
        if isinstance(e, Fatal):
            raise
        logging.warning("could not report the backend's kernel catalog: %s", e)


def parser() -> argparse.ArgumentParser:
    """Flags for the settings in WorkerSettings; an absent flag leaves the environment's value (or default)."""
    p = argparse.ArgumentParser(prog="aiter-tuner-worker", description=__doc__,
                                epilog="Every flag also reads TUNER_<NAME> from the environment (AITER_ROOT, "
                                       "AITER_COMMIT, AITER_PACKAGE_DIR for AITER's own).")
    from workers.settings import WorkerSettings
    fields = WorkerSettings.model_fields
    p.add_argument("--service", dest="service_url", help=f"default {fields['service_url'].default}")
    p.add_argument("--backend", choices=["aiter", "torch"], help="default aiter")
    for name, kind in (("gpu", int), ("budget_s", float), ("image_digest", str), ("worker_id", str),
                       ("aiter_root", str), ("aiter_commit", str), ("aiter_package", str), ("token", str),
                       ("token_file", str), ("max_batches", int), ("max_shapes", int), ("repeats", int),
                       ("candidate_limit_s", float), ("poll_s", float), ("outage_log_s", float), ("spool_dir", str),
                       ("compile_budget_s", float), ("min_improvement_pct", float), ("mem_cap_gib", float)):
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, help=fields[name].description)
    p.add_argument("--race", choices=["halving", "exhaustive"], help=fields["race"].description)
    p.add_argument("--once", action="store_true", default=None, help="exit when nothing is queued or leased for this worker's identity "
                   "(a shape leased to a worker that dies comes back to the queue)")
    return p


def _fail(code: int, reason: str) -> int:
    print(f"aiter-tuner-worker: error: {reason}", file=sys.stderr, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    stop = threading.Event()  # SIGTERM/SIGINT from here on: the agent finishes its shape, releases, exits 0
    previous = {sig: signal.signal(sig, lambda _n, _f: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _main(argv, stop)
    finally:
        for sig, handler in previous.items():  # main() called in-process (tests) leaves the caller's handlers
            signal.signal(sig, handler)


def _main(argv: list[str] | None, stop: threading.Event) -> int:
    from pydantic import ValidationError

    from workers.settings import WorkerSettings
    args = vars(parser().parse_args(argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        cfg = WorkerSettings.load(args)
        token = cfg.resolved_token()
    except ValidationError as e:
        err = e.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else "?"
        flag = "--service" if name == "service_url" else "--" + name.replace("_", "-")
        return _fail(2, f"{flag} ({WorkerSettings.env_name(name)}): {err['msg'].removeprefix('Value error, ')}")
    except (OSError, ValueError) as e:
        return _fail(2, f"--token-file (TUNER_TOKEN_FILE): {e}")
    digest = cfg.image_digest
    if not digest:
        return _fail(2, "--image-digest (or TUNER_IMAGE_DIGEST) is required")
    from workers.agent import Agent, AgentConfig
    from workers.client import Fatal, ServiceClient
    from workers.identity import default_worker_id, detect
    client = ServiceClient(cfg.service_url, token=token, stop=stop, outage_log_every_s=cfg.outage_log_s)
    try:
        ident = detect(cfg.gpu)
        backend = make_backend(cfg, ident.device, ident.llc_bytes)
        worker_id = cfg.worker_id or default_worker_id(ident)
        agent_cfg = AgentConfig(worker_id=worker_id, image_digest=digest, budget_s=cfg.budget_s,
                                compile_budget_s=cfg.compile_budget_s,
                                aiter_commit=cfg.aiter_commit, once=bool(cfg.once), poll_s=cfg.poll_s,
                                max_batches=cfg.max_batches, max_shapes=cfg.max_shapes, spool_dir=cfg.spool_dir)
        agent = Agent(client, backend, ident, agent_cfg)
        agent.install_signals()
        report_image_tables(client, cfg, digest)
        report_kernel_catalog(client, digest, backend)
        stats = agent.run()
    except Fatal as e:
        return _fail(3, str(e))
    finally:
        client.close()
    out: dict[str, Any] = {
        "worker_id": worker_id, "gfx": ident.gfx, "cu_num": ident.cu_num, "batches": stats.batches,
        "posted": stats.posted, "released": stats.released, "lost_leases": stats.lost_leases,
        "refused": stats.refused, "backend_errors": stats.backend_errors, "superseded": stats.superseded,
        "spooled": stats.spooled, "retries": client.retries, "overruns": stats.overruns, "budget_s": stats.budget_s}
    if client.idle_reason:
        out["idle"] = client.idle_reason  # why the last lease request got no work
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
