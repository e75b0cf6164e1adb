"""How a served image starts a worker without this checkout: the wheel installed at start into a venv over the
image's own site-packages (its torch and aiter stay), from a wheelhouse mounted read-only, then the console script.
One home for the pool (workers/pool.py), the Slurm launcher (app/launch/slurm.py) and the Kubernetes manifests;
standard library only."""

from __future__ import annotations

WHEELS = "/opt/aiter-tuner/wheels"  # the wheelhouse, mounted read-only
TOKEN_PATH = "/run/secrets/aiter-tuner-token"  # the token file, mounted read-only
VENV = "/tmp/aiter-tuner-venv"  # in the container's own layer: kept across its restarts, gone with it
# The container's command: the venv (with the image's site-packages), the wheels, then the console script. Python
# only (every served image has python3; a shell need not be there); a restart of the same container reuses it.
BOOTSTRAP = f"""\
import glob, os, subprocess, sys, venv
w, env = {WHEELS!r}, os.environ.get("AITER_TUNER_VENV", {VENV!r})
exe = os.path.join(env, "bin", "aiter-tuner-worker")
if not os.path.exists(os.path.join(env, ".installed")):
    venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True, clear=True).create(env)
    pip = sorted(glob.glob(os.path.join(w, "pip-*.whl")))
    wheels = sorted(set(glob.glob(os.path.join(w, "*.whl"))) - set(pip))
    if not any(os.path.basename(x).startswith("aiter_tuner-") for x in wheels):
        sys.exit("aiter-tuner: no aiter_tuner wheel in " + w + " (scripts/build_wheelhouse.sh builds it)")
    run = [os.path.join(pip[-1], "pip")] if pip else ["-m", "pip"]  # pip runs from its own wheel
    subprocess.run([os.path.join(env, "bin", "python"), *run, "install", "-q", "--no-deps", "--no-index",
                    "--no-cache-dir", "--disable-pip-version-check", "--no-warn-script-location", *wheels],
                   check=True)
    open(os.path.join(env, ".installed"), "w").close()
print("aiter-tuner: starting", exe, flush=True)
os.execv(exe, [exe, *sys.argv[1:]])
"""
