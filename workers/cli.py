"""aiter-tuner-worker: one agent per GPU, inside the served image's container."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from workers.agent import Agent, AgentConfig
from workers.client import ServiceClient
from workers.identity import detect


def make_backend(name: str, device: str, args: argparse.Namespace):  # type: ignore[no-untyped-def]
    if name == "torch":
        from workers.backends.torch_race import TorchBackend
        return TorchBackend(device=device, repeats=args.repeats, candidate_limit_s=args.candidate_limit_s)
    if name == "aiter":
        from pathlib import Path

        from workers.backends.aiter_tuner import AiterBackend
        return AiterBackend(root=Path(args.aiter_root) if args.aiter_root else None)
    raise SystemExit(f"unknown backend {name!r}: expected torch or aiter")


def report_image_tables(client: ServiceClient, args: argparse.Namespace) -> None:
    """Tell the service this image's own AITER tables and version, so outputs follow its headers."""
    from pathlib import Path

    from workers import image_tables
    pkg = Path(args.aiter_package) if args.aiter_package else image_tables.aiter_package_dir()
    if pkg is None or not (pkg / "configs").is_dir():
        logging.info("no AITER package here: not reporting image tables")
        return
    try:
        stored = image_tables.report(client, args.image_digest, pkg, args.aiter_commit)
        logging.info("reported the image's AITER tables: %s", stored)
    except Exception as e:  # the service keeps the family defaults; tuning can go on
        logging.warning("could not report the image's AITER tables: %s", e)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aiter-tuner-worker", description=__doc__)
    p.add_argument("--service", default=os.environ.get("TUNER_SERVICE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--gpu", type=int, default=int(os.environ.get("TUNER_GPU", "0")),
                   help="GPU index (within HIP_VISIBLE_DEVICES); ignored on a machine without a GPU")
    p.add_argument("--budget-s", type=float, default=float(os.environ.get("TUNER_BUDGET_S", "300")),
                   help="time budget of one leased batch")
    p.add_argument("--backend", default=os.environ.get("TUNER_BACKEND", "aiter"), choices=["aiter", "torch"])
    p.add_argument("--image-digest", default=os.environ.get("TUNER_IMAGE_DIGEST"),
                   help="digest of the image this container runs (the pool manager sets TUNER_IMAGE_DIGEST)")
    p.add_argument("--worker-id", default=os.environ.get("TUNER_WORKER_ID"))
    p.add_argument("--aiter-root", default=os.environ.get("AITER_ROOT"))
    p.add_argument("--aiter-commit", default=os.environ.get("AITER_COMMIT"))
    p.add_argument("--aiter-package", default=os.environ.get("AITER_PACKAGE_DIR"),
                   help="the installed aiter package dir (default: found by import); its configs/ are reported")
    p.add_argument("--token", default=os.environ.get("TUNER_TOKEN"))
    p.add_argument("--once", action="store_true", help="exit when the service has no work")
    p.add_argument("--max-batches", type=int)
    p.add_argument("--max-shapes", type=int)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--candidate-limit-s", type=float, default=10.0)
    p.add_argument("--poll-s", type=float, default=5.0)
    p.add_argument("--spool-dir", default=os.environ.get("TUNER_SPOOL_DIR"),
                   help="finished results wait here until the service takes them (default: per worker, under ~)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args.image_digest:
        print("error: --image-digest (or TUNER_IMAGE_DIGEST) is required", file=sys.stderr)
        return 2
    ident = detect(args.gpu)
    backend = make_backend(args.backend, ident.device, args)
    worker_id = args.worker_id or f"{ident.host}-gpu{args.gpu}"
    client = ServiceClient(args.service, token=args.token)
    cfg = AgentConfig(worker_id=worker_id, image_digest=args.image_digest, budget_s=args.budget_s,
                      aiter_commit=args.aiter_commit, once=args.once, poll_s=args.poll_s,
                      max_batches=args.max_batches, max_shapes=args.max_shapes, spool_dir=args.spool_dir)
    agent = Agent(client, backend, ident, cfg)
    agent.install_signals()
    report_image_tables(client, args)
    try:
        stats = agent.run()
    finally:
        client.close()
    print(json.dumps({"worker_id": worker_id, "gfx": ident.gfx, "cu_num": ident.cu_num, "batches": stats.batches,
                      "posted": stats.posted, "released": stats.released, "lost_leases": stats.lost_leases,
                      "refused": stats.refused, "backend_errors": stats.backend_errors,
                      "superseded": stats.superseded, "spooled": stats.spooled,
                      "retries": client.retries}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
