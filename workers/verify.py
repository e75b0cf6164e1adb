"""Verify a deployed overlay in the served image, and post the outcome to the service (the campaign page
shows it):

    aiter-tuner verify --service URL --image-digest sha256:... --family bf16_gemm
        replays the overlay's rows through AITER's production op with the family tuner's --run_config
        (AITER sets AITER_REBUILD=2 itself so compiled tables rebuild);
    aiter-tuner verify --service URL --engagement --campaign 7 [--form layer|merged|model_configs_dropin]
        deploys the form the deploy plan offers (its env value, or the drop-in file), imports this image's AITER
        and calls AITER's own lookup for every captured shape of the campaign: the proof beside the prediction.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

from app.domain.families import TableFamily, get_family, release_named
from app.domain.tables import read_table, render_csv
from workers.backends.aiter_tuner import default_aiter_root, run_config_command
from app import aiter_install
from workers.client import ServiceClient
from app.domain.engagement import row_identity
from workers.engagement_probe import ProbeBroken, make_probe, needs_file, outcome, resolved_file


def verify(client: ServiceClient, digest: str, family: str, root: Path, worker_id: str, timeout_s: float,
           python: str = sys.executable, aiter_commit: str | None = None) -> dict:
    fam = get_family(family)
    # the overlay as built now (version=latest), the one this check proves before it is A/B'd or deployed
    r = client.http.get(f"/v1/overlays/{digest}/{fam.name}.csv", params={"exclude_shipped": "true",
                                                                         "version": "latest"})
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
            # as subprocess kept them: str, or bytes where it had not decoded them yet (shown as they are)
            shown = f"{e.stdout or ''}{e.stderr or ''}"  # type: ignore[str-bytes-safe]
            rc, out = 124, f"{shown}\n[verify] timed out after {timeout_s}s"
    body = {"image_digest": digest, "family": fam.name, "worker_id": worker_id, "aiter_commit": aiter_commit,
            "rows": len(overlay.rows), "exit_code": rc, "command": shlex.join(cmd)[:4000],
            "output_tail": out[-20_000:]}
    res = client.http.post("/v1/verifications", json=body)
    res.raise_for_status()
    return res.json()


@dataclass
class AiterAtHand:
    """This image's AITER, imported after the env var is set: modules by file, the enums, its core, csrc."""
    load: Callable[[str], Any]
    enums: Any
    core: Any
    csrc: Path | None
    gfx: str
    cu_num: int
    flydsl: bool
    commit: str | None = None
    version: str | None = None
    importer: Callable[[str], Any] = importlib.import_module  # a module by dotted name, as AITER's imports find it


def import_image_aiter() -> AiterAtHand:
    aiter = importlib.import_module("aiter")
    chip = importlib.import_module("aiter.jit.utils.chip_info")
    pkg = Path(aiter.__file__).resolve().parent  # type: ignore[arg-type]  # a package imported from files
    csrc = next((c for c in (pkg.parent / "aiter_meta" / "csrc", pkg.parent / "csrc") if c.is_dir()), None)
    return AiterAtHand(lambda path: importlib.import_module(path.removesuffix(".py").replace("/", ".")), aiter,
                       importlib.import_module("aiter.jit.core"), csrc, chip.get_gfx_runtime(), chip.get_cu_num(),
                       aiter_install.flydsl_available(), aiter_install.aiter_commit(pkg),
                       aiter_install.aiter_version(pkg))


def engagement(client: ServiceClient, campaign_id: int, worker_id: str, form: str | None = None,
               aiter: Callable[[], AiterAtHand] = import_image_aiter) -> dict:
    """Deploy the plan's form here, call AITER's own lookup per captured shape, post the hits."""
    http = client.http
    camp = http.get(f"/v1/campaigns/{campaign_id}").raise_for_status().json()
    digest, family = camp["image_digest"], camp["family"]
    # the overlay as built now (version=latest): the file the service's engagement report predicts for
    plan = http.get(f"/v1/overlays/{digest}/{family}/deploy", params={"version": "latest"}).raise_for_status().json()
    form = form or (plan["offered"] or ["layer"])[0]
    release, rows = _report(client, campaign_id, form)
    fam = release_named(release).family(family)
    text = http.get(f"/v1/overlays/{digest}/{family}.csv",
                    params={"form": form, "version": "latest"}).raise_for_status().text
    with tempfile.TemporaryDirectory(prefix="aiter-engagement-") as tmp:
        value, dropped = _deployed_here(plan, form, text, Path(tmp))
        try:
            with _env_set(fam.env_var, value):
                at = aiter()
                error, results = _proved(at, fam, rows)
        finally:
            if dropped is not None:
                dropped.unlink(missing_ok=True)
    body = {"form": form, "worker_id": worker_id, "aiter_commit": at.commit, "aiter_version": at.version,
            "flydsl": at.flydsl, "error": error, "results": results}
    return http.post(f"/v1/campaigns/{campaign_id}/engagement/proofs", json=body).raise_for_status().json()


def _report(client: ServiceClient, campaign_id: int, form: str) -> tuple[str, list[dict]]:
    """The service's engagement report on the form: its release, and every shape's row (it comes a page at a
    time)."""
    http = client.http
    report = http.get(f"/v1/campaigns/{campaign_id}/engagement", params={"form": form}).raise_for_status().json()
    rows, nxt = list(report["report"]), report.get("next")
    while nxt:
        page = http.get(f"/v1/campaigns/{campaign_id}/engagement",
                        params={"form": form, "after": nxt}).raise_for_status().json()
        rows, nxt = rows + page["report"], page.get("next")
    return report["release"], rows


def _deployed_here(plan: dict, form: str, text: str, tmp: Path) -> tuple[str | None, Path | None]:
    """The overlay's text deployed as the plan's form says: (the env var's value, None to unset it; the drop-in
    file written into the image's model_configs/, to take out afterwards)."""
    if form == "layer":
        mine = Path(tmp, plan["layer"]["overlay"].rsplit("/", 1)[-1])
        mine.write_text(text)
        return ":".join(str(mine) if f == plan["layer"]["overlay"] else f for f in plan["layer"]["files"]), None
    if form == "merged":
        mine = Path(tmp, plan["merged"]["file"].rsplit("/", 1)[-1])
        mine.write_text(text)
        return str(mine), None
    # the drop-in is the deploy itself: a file in the image's model_configs/, taken out afterwards
    dropped = Path(plan["model_configs_dropin"]["copy_to"])
    dropped.write_text(text)
    return None, dropped


@contextmanager
def _env_set(name: str, value: str | None) -> Iterator[None]:
    """The family's env var set to value (None: unset) and AITER_LOG_TUNED_CONFIG=1, for AITER's import; the
    family's var put back afterwards."""
    old = os.environ.get(name)
    try:
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
        os.environ["AITER_LOG_TUNED_CONFIG"] = "1"
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _proved(at: AiterAtHand, fam: TableFamily, rows: list[dict]) -> tuple[str | None, list[dict]]:
    """AITER's own lookup of every shape of the report: (what AITER raised resolving the deploy, or None; the
    results). A shape AITER raises on is its verdict; the next shapes are still probed."""
    results: list[dict] = []
    try:
        # a lookup that resolves its table itself does so inside the probe, as in the server
        tuned_file = (resolved_file(at.core, fam.aiter_file_attr)  # type: ignore[arg-type]  # named by a
                      if needs_file(fam) else None)  # family whose probe needs its file
        look = make_probe(fam, at.load, at.enums, at.flydsl, at.gfx, at.cu_num, at.csrc, tuned_file, at.importer)
        for r in rows:
            hit, cfg, raised = outcome(look, r["shape"])
            found = cfg is not None and any(c in cfg for c in ("us", "kernelName1", "BV"))
            results.append({"shape_id": r["shape_id"], "hit": bool(hit), "raised": raised,
                            "row": row_identity(cfg) if found else None,
                            "kernel": None if cfg is None or not hit else
                            str(cfg.get("kernelName") or cfg.get("kernelName1") or "")})
    except ProbeBroken:
        raise  # the probe itself, not AITER: no proof is posted
    except Exception as e:  # noqa: BLE001  AITER raised on this deploy (resolving it): that is the finding
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", results
    return None, results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="aiter-tuner verify", description=__doc__)
    p.add_argument("--service", default=os.environ.get("TUNER_SERVICE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--image-digest", default=os.environ.get("TUNER_IMAGE_DIGEST"), required=False)
    p.add_argument("--family")
    p.add_argument("--engagement", action="store_true", help="prove the engagement verdict with AITER's lookup")
    p.add_argument("--campaign", type=int, help="the campaign whose captured shapes to look up (--engagement)")
    p.add_argument("--form", choices=("layer", "merged", "model_configs_dropin"))
    p.add_argument("--aiter-root", default=os.environ.get("AITER_ROOT"))
    p.add_argument("--worker-id", default=os.environ.get("TUNER_WORKER_ID", "verify"))
    p.add_argument("--token", default=os.environ.get("TUNER_TOKEN"))
    p.add_argument("--timeout-s", type=float, default=1800)
    a = p.parse_args(argv)
    if a.engagement:
        if a.campaign is None:
            print("error: --engagement needs --campaign", file=sys.stderr)
            return 2
        client = ServiceClient(a.service, token=a.token)
        try:
            res = engagement(client, a.campaign, a.worker_id, a.form)
        finally:
            client.close()
        print(json.dumps(res))
        return 0
    if not a.family:
        print("error: need --family (or --engagement --campaign)", file=sys.stderr)
        return 2
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
