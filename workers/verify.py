"""Verify a deployed overlay in the served image: fetch it, replay its rows through AITER's production op
with the family tuner's --run_config (AITER sets AITER_REBUILD=2 itself so compiled tables rebuild), and
post the outcome to the service, where the campaign page shows it.

    python -m workers.verify --service URL --image-digest sha256:... --family bf16_gemm
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from app.domain.families import get_family
from app.domain.tables import read_table, render_csv
from workers.backends.aiter_tuner import default_aiter_root, run_config_command
from workers.client import ServiceClient


def verify(client: ServiceClient, digest: str, family: str, root: Path, worker_id: str, timeout_s: float,
           python: str = sys.executable, aiter_commit: str | None = None) -> dict:
    fam = get_family(family)
    r = client.http.get(f"/v1/overlays/{digest}/{fam.name}.csv", params={"exclude_shipped": "true"})
    r.raise_for_status()
    overlay = read_table(r.text, "overlay")
    schemas = {x["family"]: x for x in client.http.get(f"/v1/images/{digest}/schemas").json()}
    untuned_header = tuple(schemas[fam.name]["untuned_header"])
    with tempfile.TemporaryDirectory(prefix="aiter-verify-") as tmp:
        csv_path, untuned = Path(tmp, fam.tuned_file), Path(tmp, fam.untuned_file)
        csv_path.write_text(r.text)
        untuned.write_text(render_csv(untuned_header, overlay.rows))
        cmd = run_config_command(fam, root, csv_path, untuned, python)
        try:
            p = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout_s)
            rc, out = p.returncode, (p.stdout + p.stderr)
        except subprocess.TimeoutExpired as e:
            rc, out = 124, f"{e.stdout or ''}{e.stderr or ''}\n[verify] timed out after {timeout_s}s"
    body = {"image_digest": digest, "family": fam.name, "worker_id": worker_id, "aiter_commit": aiter_commit,
            "rows": len(overlay.rows), "exit_code": rc, "command": shlex.join(cmd)[:4000],
            "output_tail": out[-20_000:]}
    res = client.http.post("/v1/verifications", json=body)
    res.raise_for_status()
    return res.json()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workers.verify", description=__doc__)
    p.add_argument("--service", default=os.environ.get("TUNER_SERVICE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--image-digest", default=os.environ.get("TUNER_IMAGE_DIGEST"), required=False)
    p.add_argument("--family", required=True)
    p.add_argument("--aiter-root", default=os.environ.get("AITER_ROOT"))
    p.add_argument("--worker-id", default=os.environ.get("TUNER_WORKER_ID", "verify"))
    p.add_argument("--token", default=os.environ.get("TUNER_TOKEN"))
    p.add_argument("--timeout-s", type=float, default=1800)
    a = p.parse_args(argv)
    root = Path(a.aiter_root) if a.aiter_root else default_aiter_root()
    if root is None or not a.image_digest:
        print("error: need --image-digest and an AITER (--aiter-root or an installed aiter)", file=sys.stderr)
        return 2
    client = ServiceClient(a.service, token=a.token)
    try:
        out = verify(client, a.image_digest, a.family, root, a.worker_id, a.timeout_s)
    finally:
        client.close()
    print(json.dumps({k: out[k] for k in ("id", "rows", "exit_code", "passed")}))
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
