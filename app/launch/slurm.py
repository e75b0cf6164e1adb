"""`aiter-tuner launch slurm`: an sbatch array script, one task per GPU, each task one worker with --once.

The HTTP lease protocol is the work queue: each task leases, tunes and exits 0 once nothing is queued or leased
for its identity, so the array ends when the campaign does; a task cancelled (`scancel JOB_TASK`: SIGTERM) gives
its lease back, one killed loses nothing either (its lease expires and the shapes are leased again). The worker
token is read from a file at run time (TUNER_TOKEN_FILE), never on a command line or in the script. Three ways to
run the worker:
- plain: the worker is installed on the nodes (`aiter-tuner-worker`, or --worker-command);
- pyxis: `srun --container-image=IMAGE@sha256:DIGEST` (NVIDIA's Pyxis/enroot, as AMD's benchmark fleets run), the
  wheelhouse and the token file mounted read-only, the wheel installed into the served image at start
  (app/launch/bootstrap.py's BOOTSTRAP: the image's torch and aiter stay);
- a site's own container runtime: --container-prefix "apptainer exec --rocm --bind ... docker://IMAGE@sha256:..."
  (it must bind the wheelhouse at /opt/aiter-tuner/wheels and the token file at /run/secrets/aiter-tuner-token).
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys

from app.wire import DIGEST_RE

TOKEN_IN_CONTAINER = "/run/secrets/aiter-tuner-token"
WHEELS_IN_CONTAINER = "/opt/aiter-tuner/wheels"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--service", required=True, help="the service URL the workers reach (http(s)://...)")
    p.add_argument("--image-digest", required=True, help="the served image's digest (sha256:...): what is tuned")
    p.add_argument("--gpus", type=int, required=True, help="array size: one task (one worker) per GPU")
    p.add_argument("--token-file", required=True,
                   help="a file holding the worker token, readable on the nodes (the path goes in the script, "
                        "the token never does)")
    p.add_argument("--runtime", choices=["plain", "pyxis", "prefix"], default="plain",
                   help="plain: the worker installed on the nodes; pyxis: srun --container-image=IMAGE@DIGEST; "
                        "prefix: --container-prefix runs the served image")
    p.add_argument("--image", help="the served image's repository (pyxis: pinned as IMAGE@DIGEST)")
    p.add_argument("--container-prefix", help="the site's container runtime command, ending with the image")
    p.add_argument("--wheelhouse", help="this project's wheelhouse on a shared path (pyxis, prefix; "
                                        "scripts/build_wheelhouse.sh)")
    p.add_argument("--worker-command", default="aiter-tuner-worker", help="plain: the worker's console script")
    p.add_argument("--gpu-request", default="--gpus-per-task=1",
                   help="the sbatch option that gives a task one GPU (a site's gres: --gres=gpu:1; 'none' for "
                        "CPU workers)")
    p.add_argument("--cpus-per-task", type=int, default=None)
    p.add_argument("--partition")
    p.add_argument("--time", help="sbatch --time (the array's tasks end on their own when nothing is queued)")
    p.add_argument("--job-name", default="aiter-tuner")
    p.add_argument("--output", default="aiter-tuner-%A_%a.out", help="sbatch --output (%%A job, %%a task)")
    p.add_argument("--budget-s", type=float, help="each lease's budget (TUNER_BUDGET_S)")
    p.add_argument("--backend", choices=["aiter", "torch"], help="TUNER_BACKEND (default: the worker's, aiter)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="more worker settings for every task, e.g. TUNER_RACE=exhaustive (repeatable)")
    p.add_argument("-o", "--out", help="write the script here (default: stdout)")


class LaunchError(ValueError):
    """A setting the script cannot be written with: the message names the flag."""


def _env_pairs(args: argparse.Namespace) -> list[tuple[str, str]]:
    pairs = [("TUNER_SERVICE_URL", args.service), ("TUNER_IMAGE_DIGEST", args.image_digest), ("TUNER_ONCE", "true")]
    if args.budget_s is not None:
        pairs.append(("TUNER_BUDGET_S", str(args.budget_s)))
    if args.backend:
        pairs.append(("TUNER_BACKEND", args.backend))
    for e in args.env:
        name, eq, value = e.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise LaunchError(f"--env: expected NAME=VALUE, got {e!r}")
        if name in ("TUNER_TOKEN",):
            raise LaunchError("--env: the token goes in --token-file, never in the script")
        pairs.append((name, value))
    return pairs


def render(args: argparse.Namespace) -> str:
    if not args.service.startswith(("http://", "https://")):
        raise LaunchError(f"--service: must start with http:// or https://, got {args.service!r}")
    if not DIGEST_RE.fullmatch(args.image_digest):
        raise LaunchError(f"--image-digest: expected sha256:<64 lowercase hex digits>, got {args.image_digest!r}")
    if args.gpus < 1:
        raise LaunchError("--gpus: at least 1")
    if args.runtime == "pyxis" and not args.image:
        raise LaunchError("--image: pyxis pins the served image as IMAGE@sha256:DIGEST: name its repository")
    if args.runtime == "prefix" and not args.container_prefix:
        raise LaunchError("--container-prefix: the site's container runtime command is needed with --runtime prefix")
    if args.runtime != "plain" and not args.wheelhouse:
        raise LaunchError("--wheelhouse: a container installs the worker from it (scripts/build_wheelhouse.sh)")
    q = shlex.quote
    sbatch = [f"--job-name={args.job_name}", f"--array=0-{args.gpus - 1}", "--ntasks=1", f"--output={args.output}"]
    if args.gpu_request and args.gpu_request != "none":
        sbatch.append(args.gpu_request)
    if args.cpus_per_task:
        sbatch.append(f"--cpus-per-task={args.cpus_per_task}")
    if args.partition:
        sbatch.append(f"--partition={args.partition}")
    if args.time:
        sbatch.append(f"--time={args.time}")
    lines = ["#!/bin/bash", "# written by `aiter-tuner launch slurm`: one worker per array task (one GPU each); each "
             "exits 0", "# when nothing is queued or leased for its identity, so the array ends with the campaign"]
    lines += [f"#SBATCH {o}" for o in sbatch]
    lines += ["set -euo pipefail"]
    in_container = args.runtime != "plain"
    lines += [f"export {k}={q(v)}" for k, v in _env_pairs(args)]
    lines += ["export TUNER_GPU=0  # the task's one GPU, as the allocation shows it",
              "# one id per task: a requeued or restarted task is the same worker, another array another one",
              'export TUNER_WORKER_ID="${SLURM_JOB_NAME//[^A-Za-z0-9._-]/_}-${SLURM_ARRAY_JOB_ID}-'
              '${SLURM_ARRAY_TASK_ID}"',
              f"export TUNER_TOKEN_FILE={q(TOKEN_IN_CONTAINER if in_container else args.token_file)}",
              f"test -r {q(args.token_file)} || {{ echo \"aiter-tuner: the token file {args.token_file} is not "
              "readable here\" >&2; exit 2; }"]
    if args.runtime == "plain":
        lines.append(f"exec {args.worker_command}")
    else:
        from app.launch.bootstrap import BOOTSTRAP
        lines.append('export AITER_TUNER_VENV="/tmp/aiter-tuner-venv-${SLURM_JOB_ID}"  # tasks may share a /tmp')
        lines += ["read -r -d '' BOOTSTRAP <<'AITER_TUNER_BOOTSTRAP' || true", BOOTSTRAP.rstrip("\n"),
                  "AITER_TUNER_BOOTSTRAP"]
        if args.runtime == "pyxis":
            mounts = f"{args.token_file}:{TOKEN_IN_CONTAINER}:ro,{args.wheelhouse}:{WHEELS_IN_CONTAINER}:ro"
            image = f"{args.image}@{args.image_digest}"
            lines.append(f"exec srun --container-image={q(image)} --container-mounts={q(mounts)} "
                         "--no-container-mount-home python3 -c \"$BOOTSTRAP\"")
        else:
            lines.append(f"exec {args.container_prefix} python3 -c \"$BOOTSTRAP\"")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    try:
        text = render(args)
    except LaunchError as e:
        print(f"aiter-tuner launch slurm: error: {e}", file=sys.stderr)
        return 2
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        print(f"wrote {args.out}: sbatch {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
