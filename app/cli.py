"""aiter-tuner: serve the service, capture from a running server, post the README's example capture, manage
tokens. Module level imports stay light (argparse, json, sys): `capture` runs in serving images without the
service's dependencies, so each command imports what it needs when it runs."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

EXAMPLE_DIGEST = "sha256:" + "0" * 63 + "1"
EXAMPLE_SHAPES = [{"M": 1, "N": 1280, "K": 8192, "count": 900}, {"M": 32, "N": 8192, "K": 1024, "count": 300},
                  {"M": 100, "N": 4096, "K": 4096, "count": 40}]


def serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ImportError:  # the base install is the light capture agent
        print("aiter-tuner serve needs the server extra: pip install 'aiter-tuner[server]'", file=sys.stderr)
        return 2

    from app.config import Settings
    from app.main import create_app, ready_to_serve
    settings = Settings()
    if args.database_url:
        settings.database_url = args.database_url
    app = create_app(settings)
    ready_to_serve(app)
    # "auto": httptools and uvloop where installed (the server extra; a lease round trip's framework share
    # halves), else h11 and asyncio
    uvicorn.run(app, host=args.host or settings.host, port=args.port or settings.port,
                log_level="info", http="auto", loop="auto",
                access_log=args.access_log)  # a log line per request costs ~5% of a lease
    return 0


def _token(args: argparse.Namespace) -> str | None:
    from pathlib import Path

    from app.config import Settings
    if args.token or os.environ.get("TUNER_TOKEN"):
        return args.token or os.environ.get("TUNER_TOKEN")
    path = Path(Settings().admin_token_file)
    return path.read_text().strip() if path.exists() else None


def _wait_up(url: str, timeout_s: float = 60) -> None:
    """A service started a moment ago (`serve &`) is given time to migrate its database and listen."""
    import time

    import httpx
    end = time.monotonic() + timeout_s
    while True:
        try:
            httpx.get(f"{url}/healthz", timeout=5).raise_for_status()
            return
        except httpx.HTTPError:
            if time.monotonic() > end:
                raise
            time.sleep(0.3)


class Refused(Exception):
    """The service answered, but not what the command needs: the message says what it said."""


def _answer(r) -> object:  # type: ignore[no-untyped-def]
    """r's JSON when it succeeded; else Refused with the service's own words (detail) and what to do."""
    try:
        body = r.json()
    except ValueError:
        body = None
    if r.is_success and body is not None:
        return body
    detail = body.get("detail") if isinstance(body, dict) else r.text[:300]
    hint = {401: ": pass a token with --token or TUNER_TOKEN (`aiter-tuner token create --role capture ...`)",
            403: ": the token's role or digest scope does not cover this (a capture token scoped to the image)"}
    raise Refused(f"{r.request.method} {r.request.url} answered {r.status_code}: {detail}{hint.get(r.status_code, '')}")


def _cpu_count() -> int:
    from app.aiter_install import cpu_count  # what a CPU worker reports as its cu_num (not nproc: OMP_NUM_THREADS)
    return cpu_count()


def example(args: argparse.Namespace) -> int:
    import httpx
    url = args.service.rstrip("/")
    try:
        _wait_up(url, args.wait_s)
    except httpx.HTTPError as e:
        print(f"aiter-tuner example-capture: could not reach the service at {url} ({type(e).__name__}: {e}) "
              f"within {args.wait_s:g} s: is `aiter-tuner serve` running there? (--service or TUNER_SERVICE_URL)",
              file=sys.stderr)
        return 1
    tok = _token(args)
    headers = {"Authorization": f"Bearer {tok}"} if tok else {}
    cu_num = args.cu_num or (_cpu_count() if args.gfx == "cpu" else 304)
    body = {"image_digest": args.image_digest, "gfx": args.gfx, "cu_num": cu_num, "family": "bf16_gemm",
            "host": "example", "shapes": EXAMPLE_SHAPES}
    try:
        r = httpx.post(f"{url}/v1/captures", json=body, timeout=30, headers=headers)
        out = _answer(r)
        print(r.status_code, json.dumps(out))
        camps = _answer(httpx.get(f"{url}/v1/campaigns", timeout=30, headers=headers))
    except Refused as e:
        print(f"aiter-tuner example-capture: {e}", file=sys.stderr)
        return 1
    except httpx.HTTPError as e:
        print(f"aiter-tuner example-capture: lost the service at {url} ({type(e).__name__}: {e})", file=sys.stderr)
        return 1
    for c in camps:  # type: ignore[attr-defined]
        print(f"campaign {c['campaign_id']}: {c['family']} {c['gfx']}/{c['cu_num']} {c['shapes']} shapes, "
              f"{c['queued']} queued")
    return 0 if r.status_code == 201 else 1


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds / 60:.1f} min"


def demand_cmd(args: argparse.Namespace) -> int:
    """What is queued and what it will cost, from the campaigns' own figures (GET /v1/demand)."""
    import httpx
    url = args.service.rstrip("/")
    tok = _token(args)
    params = {k: v for k, v in (("image_digest", args.image_digest), ("gfx", args.gfx), ("cu_num", args.cu_num))
              if v is not None}
    try:
        d = _answer(httpx.get(f"{url}/v1/demand", params=params, timeout=30,
                              headers={"Authorization": f"Bearer {tok}"} if tok else {}))
    except Refused as e:
        print(f"aiter-tuner demand: {e}", file=sys.stderr)
        return 1
    except httpx.HTTPError as e:
        print(f"aiter-tuner demand: could not reach the service at {url} ({type(e).__name__}: {e})", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(d, indent=1))
        return 0
    assert isinstance(d, dict)
    for row in d["identities"]:
        unit = "CPU" if row["gfx"] == "cpu" else "GPU"
        print(f"{row['image_digest']} {row['gfx']}/{row['cu_num']}: {row['queued_shapes']} shapes queued "
              f"({row['leased_shapes']} leased), about {_hours(row['gpu_s_queued_est'])} of {unit} time")
        for f in row["families"]:
            if f["queued_shapes"] or f["leased_shapes"]:
                print(f"  {f['family']} (campaign {f['campaign_id']}): {f['queued_shapes']} x "
                      f"{f['est_shape_cost_s']:.1f} s per shape ({f['cost_basis']})")
    t = d["total"]
    print(f"total: {t['queued_shapes']} shapes queued, about {_hours(t['gpu_s_queued_est'])} of device time "
          f"({t['gpu_s_queued_est']:.0f} s); on N devices about 1/N of it")
    return 0


def _write_secret(path: str, secret: str) -> None:
    """Mode 0600, whole or not at all: a reader never sees half a token."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    os.replace(tmp, path)


def token_cmd(args: argparse.Namespace) -> int:
    """Manage API tokens directly in the service's database (DATABASE_URL)."""
    from app.config import Settings
    from app.db import migrate
    from app.db.session import Database
    from app.errors import Invalid
    from app.services import tokens
    settings = Settings()
    migrate.upgrade(settings.database_url)
    db = Database(settings.database_url)
    try:
        with db.session() as s:
            if args.action == "create":
                try:
                    tok, secret = tokens.create(s, args.name, args.role, args.digest or None)
                except Invalid as e:
                    print(f"error: {e.detail}", file=sys.stderr)
                    return 2
                out = {"id": tok.id, "name": tok.name, "role": tok.role, "digests": tok.digests, "token": secret}
                if args.secret_file:  # the secret alone, for a container to read (docker-compose.yml)
                    _write_secret(args.secret_file, secret)
                    out["token"] = f"(in {args.secret_file})"
                print(json.dumps(out))
            elif args.action == "list":
                print(json.dumps(tokens.listing(s), indent=1))
            elif not tokens.revoke(s, args.id):
                print(f"no live token {args.id}", file=sys.stderr)
                return 1
            else:
                print(f"revoked {args.id}")
    finally:
        db.dispose()
    return 0


def inherit_cmd(args: argparse.Namespace) -> int:
    """An image upgrade, directly in the service's database (DATABASE_URL): NEW inherits OLD's campaigns and tuning."""
    from app.config import Settings
    from app.db import migrate
    from app.db.session import Database
    from app.errors import DomainError
    from app.services import upgrades
    from app.wire import check_digest
    try:
        new, old = check_digest(args.image), check_digest(args.from_)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    settings = Settings()
    migrate.upgrade(settings.database_url)
    db = Database(settings.database_url)
    try:
        with db.session() as s:
            out = upgrades.inherit(s, new, old)
    except DomainError as e:
        print(f"error: {e.detail}", file=sys.stderr)
        return 2
    finally:
        db.dispose()
    print(json.dumps(out, indent=1))
    return 0


def ab_cmd(args: argparse.Namespace) -> int:
    """The serving A/B against a running service (light: httpx and pydantic, like `capture`)."""
    import httpx
    if args.action == "drive":
        from app.ab_bench import check_template
        from app.ab_driver import drive
        if args.load_cmd and (why := check_template(args.load_cmd)):
            print(f"--load-cmd: {why}", file=sys.stderr)
            return 2
        args.token = _token(args)
        return drive(args)
    url = args.service.rstrip("/")
    tok = _token(args)
    headers = {"Authorization": f"Bearer {tok}"} if tok else {}
    c = httpx.Client(base_url=url, headers=headers, timeout=120)
    if args.action == "version":
        body = {"image_digest": args.image_digest, "form": args.form}
        if args.family:
            body["families"] = args.family
        r = c.post("/v1/ab/versions", json=body)
    elif args.action == "create":
        body = {"image_digest": args.image_digest, "version_id": args.version, "baseline": args.baseline,
                "repeats": args.repeats, "requests_per_pass": args.requests, "confidence": args.confidence,
                "seed": args.seed, "min_requests": args.min_requests, "max_loss": args.max_loss,
                "max_repeats": args.max_repeats, "target_mde": args.target_mde, "min_effect": args.min_effect}
        if args.point:
            pts = []
            for p in args.point:
                try:
                    vals = [int(x) for x in p.split(":")]
                    if len(vals) not in (3, 4):
                        raise ValueError
                except ValueError:
                    print(f"--point: expected CONCURRENCY:INPUT_LEN:OUTPUT_LEN[:REQUESTS], got {p!r}",
                          file=sys.stderr)
                    return 2
                pts.append(dict(zip(("concurrency", "input_len", "output_len", "requests"), vals)))
            body["points"] = pts
        r = c.post("/v1/ab/runs", json=body)
    elif args.action == "show":
        r = c.get(f"/v1/ab/runs/{args.run}")
    elif args.action == "finish":
        r = c.post(f"/v1/ab/runs/{args.run}/finish")
    elif args.action == "promote":
        r = c.post(f"/v1/ab/runs/{args.run}/promote")
    elif args.action == "versions":
        r = c.get("/v1/ab/versions", params={"image_digest": args.image_digest})
    else:
        r = c.get("/v1/ab/runs", params={"image_digest": args.image_digest} if args.image_digest else {})
    print(json.dumps(r.json(), indent=1))
    return 0 if r.status_code < 400 else 1


def capture(args: argparse.Namespace) -> int:
    from app.capture.agent import run  # light: httpx and pydantic only, for serving images
    return run(args)


def verify(argv: list[str]) -> int:
    """Hands on to the worker's console script aiter-tuner-verify (workers/verify.py: in the served image, with the
    worker's dependencies): the service's package never imports the worker's (tests/unit/test_layering.py)."""
    import shutil
    from pathlib import Path
    beside = Path(sys.argv[0]).resolve().parent / "aiter-tuner-verify"
    exe = str(beside) if beside.is_file() else shutil.which("aiter-tuner-verify")
    if exe is None:
        print("aiter-tuner verify needs the worker's console script aiter-tuner-verify: "
              "pip install 'aiter-tuner[worker]'", file=sys.stderr)
        return 2
    os.execv(exe, [exe, *argv])


def _token_parser(sub: Any) -> None:
    """`aiter-tuner token create|list|revoke`, on the database at DATABASE_URL."""
    t = sub.add_parser("token", help="create, list or revoke API tokens (in the database at DATABASE_URL)")
    tsub = t.add_subparsers(dest="action", required=True)
    c = tsub.add_parser("create")
    c.add_argument("--role", required=True, choices=["capture", "worker", "admin", "read"])
    c.add_argument("--name", required=True)
    c.add_argument("--digest", action="append", help="scope to this image digest (repeatable)")
    c.add_argument("--secret-file", help="write the token's secret to this file (0600) instead of printing it")
    tsub.add_parser("list")
    r = tsub.add_parser("revoke")
    r.add_argument("id", type=int)
    t.set_defaults(fn=token_cmd)


def _launch_parser(sub: Any) -> None:
    """`aiter-tuner launch ENGINE`: one group, an engine each (app/launch/)."""
    from app.launch import k8s, slurm  # light: argparse and the jobs' data
    la = sub.add_parser("launch", help="start workers (and the service) where fleets run them")
    lsub = la.add_subparsers(dest="engine", required=True)
    lk = lsub.add_parser("k8s", help="write Kubernetes manifests: the workers' work-queue Job (and a KEDA "
                                     "ScaledJob), the service on PostgreSQL, the Secrets they read")
    k8s.add_arguments(lk)
    lk.set_defaults(fn=k8s.main)
    sl = lsub.add_parser("slurm", help="an sbatch array script: one task (one worker, --once) per GPU")
    slurm.add_arguments(sl)
    sl.set_defaults(fn=slurm.run)


def _ab_parser(sub: Any) -> None:
    """`aiter-tuner ab ...`: the serving A/B's versions, runs, driver and promotion (issue 32)."""
    ab = sub.add_parser("ab", help="the serving A/B: versions, runs, the driver beside the servers, promotion")
    ab.add_argument("--service", default=os.environ.get("TUNER_SERVICE_URL", "http://127.0.0.1:8000"))
    ab.add_argument("--token", default=None, help="default TUNER_TOKEN, then the admin token file")
    asub = ab.add_subparsers(dest="action", required=True)
    v = asub.add_parser("version", help="freeze the image's overlay as deployed (each file's sha256)")
    v.add_argument("image_digest")
    v.add_argument("--form", default="layer", choices=["layer", "merged"])
    v.add_argument("--family", action="append")
    cr = asub.add_parser("create", help="a run: VERSION against the baseline, per band")
    cr.add_argument("image_digest")
    cr.add_argument("--version", type=int, required=True)
    cr.add_argument("--baseline", default="promoted", help="shipped | promoted (default) | a version id")
    cr.add_argument("--point", action="append", help="CONCURRENCY:INPUT_LEN:OUTPUT_LEN[:REQUESTS] (REQUESTS: this "
                    "band's requests per pass, else --requests; default bands: from the image's captured served load)")
    cr.add_argument("--repeats", type=int, default=6,
                    help="rounds per band, even (mirrored pairs; 6: every arm in every position twice)")
    cr.add_argument("--requests", type=int, default=32, help="requests per pass")
    cr.add_argument("--confidence", type=float, default=0.95)
    cr.add_argument("--min-requests", type=int, default=4)
    cr.add_argument("--seed", type=int, default=0)
    cr.add_argument("--max-loss", type=float, default=0.05, help="promotion needs every band's interval to rule "
                                                                  "out a throughput loss above this (0.05: 5%%)")
    cr.add_argument("--max-repeats", type=int, default=None, help="sequential rounds: a band still undecided "
                    "after --repeats rounds is measured 6 rounds more at a time up to this many (default: --repeats)")
    cr.add_argument("--target-mde", type=float, default=0.03, help="an undecided band stops once its minimum "
                    "detectable effect is at most this (0.03: 3%%)")
    cr.add_argument("--min-effect", type=float, default=0.01, help="the smallest effect of interest: a "
                    "significant effect below it reads neutral, within margin (0.01: 1%%)")
    _ab_drive_parser(asub)
    for name in ("show", "finish", "promote"):
        x = asub.add_parser(name)
        x.add_argument("run", type=int)
    ls = asub.add_parser("list")
    ls.add_argument("image_digest", nargs="?")
    vs = asub.add_parser("versions")
    vs.add_argument("image_digest")
    ab.set_defaults(fn=ab_cmd)


def _ab_drive_parser(asub: Any) -> None:
    """`aiter-tuner ab drive`: the driver beside the servers (app/ab_driver.py)."""
    from app.ab_bench import PRESETS
    dr = asub.add_parser("drive", help="measure a run beside the servers (re-run to resume)")
    dr.add_argument("run", type=int)
    dr.add_argument("--model", required=True)
    dr.add_argument("--endpoint", action="append", help="ARM=URL of a running server (A's serves A_prime too)")
    dr.add_argument("--log", action="append", help="ARM=its server log path (one file: ranks by their lines' "
                                                   "prefixes; see --rank-log)")
    dr.add_argument("--launch", help="a shell command starting one arm's server (redirects, pipes, tee work); "
                                     "{port}, {log}, {arm}, {ranks}, {model} are filled in (shell-quoted), the "
                                     "arm's AITER_CONFIG_* set in its environment. E.g. 'vllm serve M --port "
                                     "{port} > {log} 2>&1'")
    dr.add_argument("--ranks", type=int, default=1, help="the ranks each server runs (tensor parallel): each must "
                                                         "log its hits")
    dr.add_argument("--rank-log", default="{log}", help="where a rank's lines are: '{log}' (default) one file, "
                    "ranks told apart by the prefixes vLLM and SGLang put on worker lines; '{log}.rank{rank}': a "
                    "file per rank")
    load = dr.add_mutually_exclusive_group()
    load.add_argument("--load", choices=("own", *PRESETS), default="own", help="the load generator: the "
                    "driver's own streaming loop (default), `vllm bench serve` or `python3 -m sglang.bench_serving` "
                    "(a subprocess per pass, its per-request JSON read back; app/ab_bench.py PRESETS)")
    load.add_argument("--load-cmd", help="the load generator's command instead of the preset's (a shell command; "
                    "{base_url}, {model}, {concurrency}, {input_len}, {output_len}, {requests}, {seed} and where it "
                    "writes its JSON, {result} or {result_dir} with {result_name}, are filled in); e.g. the vllm "
                    "preset with --tokenizer T")
    dr.add_argument("--workdir", default=".ab-drive")
    dr.add_argument("--health-timeout", type=float, default=120.0)
    dr.add_argument("--max-passes", type=int, default=None, help="stop after this many passes (resume later)")
    dr.add_argument("--stall-s", type=float, default=None, help="measure a pass again when the driver's event "
                    "loop woke this many seconds late during it (a stalled node; default 0.1, app/ab_driver.py "
                    "STALL_S); 0: never")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["verify"]:  # its flags are workers.verify's own: handed on whole
        return verify(argv[1:])
    p = argparse.ArgumentParser(prog="aiter-tuner")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the service (migrates its database first)")
    s.add_argument("--host", help="the address to listen on (default TUNER_HOST or 127.0.0.1; the capture agent's "
                                  "own name is TUNER_HOSTNAME)")
    s.add_argument("--port", type=int, help="default TUNER_PORT or 8000")
    s.add_argument("--database-url", default=None)
    s.add_argument("--access-log", action="store_true", help="log every request (Prometheus counts them anyway)")
    s.set_defaults(fn=serve)
    e = sub.add_parser("example-capture", help="post a tiny bf16 capture to a running service")
    e.add_argument("--service", default=os.environ.get("TUNER_SERVICE_URL", "http://127.0.0.1:8000"),
                   help="default TUNER_SERVICE_URL (what workers read too) or http://127.0.0.1:8000")
    e.add_argument("--token", default=None, help="a capture token (default: TUNER_TOKEN, then the admin token file)")
    e.add_argument("--image-digest", default=EXAMPLE_DIGEST, help="the image the shapes are for (default: sha256:0…01)")
    e.add_argument("--gfx", default="gfx942", help="the identity workers will report: gfx942, gfx950, cpu, ...")
    e.add_argument("--wait-s", type=float, default=60.0,
                   help="how long to wait for the service to answer /healthz (a `serve &` just started)")
    e.add_argument("--cu-num", type=int, default=None,
                   help="their CU count (default: with --gfx cpu, the CPUs this process may use, as a CPU worker on "
                        "this machine reports them; else 304)")
    e.set_defaults(fn=example)
    dm = sub.add_parser("demand", help="the work queued per worker identity and its estimated device time, from "
                                       "the campaigns' own figures (GET /v1/demand)")
    dm.add_argument("--service", default=os.environ.get("TUNER_SERVICE_URL", "http://127.0.0.1:8000"))
    dm.add_argument("--token", default=None, help="a read token where reads are closed (default: TUNER_TOKEN, "
                                                  "then the admin token file)")
    dm.add_argument("--image-digest")
    dm.add_argument("--gfx")
    dm.add_argument("--cu-num", type=int)
    dm.add_argument("--json", action="store_true", help="the endpoint's answer as it is")
    dm.set_defaults(fn=demand_cmd)
    from app.capture.agent import add_arguments
    cap = sub.add_parser("capture", help="follow a server's log (and vLLM metrics) and post AITER's lookups")
    add_arguments(cap)
    cap.set_defaults(fn=capture)
    sub.add_parser("verify", add_help=False,
                   help="in the served image: replay a deployed overlay, or prove the engagement verdict with "
                        "AITER's own lookup (`aiter-tuner verify --help`)")
    _token_parser(sub)
    _launch_parser(sub)
    i = sub.add_parser("inherit", help="an image upgrade: IMAGE inherits the campaigns and tuning of --from "
                                       "(in the database at DATABASE_URL)")
    i.add_argument("image", help="the new image's digest (sha256:...)")
    i.add_argument("--from", dest="from_", required=True, help="the image it upgrades")
    i.set_defaults(fn=inherit_cmd)
    _ab_parser(sub)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
