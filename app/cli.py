"""aiter-tuner: serve the service, or post the tiny example capture the README shows."""

from __future__ import annotations

import argparse
import json
import sys

EXAMPLE_DIGEST = "sha256:" + "0" * 63 + "1"
EXAMPLE_SHAPES = [{"M": 1, "N": 1280, "K": 8192, "count": 900}, {"M": 32, "N": 8192, "K": 1024, "count": 300},
                  {"M": 100, "N": 4096, "K": 4096, "count": 40}]


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.config import Settings
    from app.main import create_app
    settings = Settings()
    if args.database_url:
        settings.database_url = args.database_url
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="info")
    return 0


def example(args: argparse.Namespace) -> int:
    import httpx
    body = {"image_digest": EXAMPLE_DIGEST, "gfx": "gfx942", "cu_num": 304, "family": "bf16_gemm",
            "host": "example", "aiter_version": "example", "shapes": EXAMPLE_SHAPES}
    r = httpx.post(f"{args.service.rstrip('/')}/v1/captures", json=body, timeout=30)
    print(r.status_code, json.dumps(r.json()))
    camps = httpx.get(f"{args.service.rstrip('/')}/v1/campaigns", timeout=30).json()
    for c in camps:
        print(f"campaign {c['campaign_id']}: {c['family']} {c['gfx']}/{c['cu_num']} {c['shapes']} shapes, "
              f"{c['queued']} queued")
    return 0 if r.status_code == 201 else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="aiter-tuner")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the service (migrates its database first)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--database-url", default=None)
    s.set_defaults(fn=serve)
    e = sub.add_parser("example-capture", help="post a tiny bf16 capture to a running service")
    e.add_argument("--service", default="http://127.0.0.1:8000")
    e.set_defaults(fn=example)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
