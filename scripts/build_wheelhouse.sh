#!/usr/bin/env bash
# The wheelhouse a worker container installs from at start (workers/pool.py's BOOTSTRAP, `pip install --no-deps
# --no-index`; a container has no network): this checkout's wheel (scripts/build_dist.sh), the worker's own needs
# (the [worker] extra: tenacity, urllib3) and pip's own wheel (pip runs from it, so the image need not have pip),
# at the versions of requirements-lock.txt. Into ${1:-dist/wheelhouse}; PYTHON=... for another interpreter.
# The wheels come from pip's cache or the index (PIP_FIND_LINKS=<dir> for an offline mirror).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
OUT="$(mkdir -p "${1:-dist/wheelhouse}" && cd "${1:-dist/wheelhouse}" && pwd)"
rm -f "$OUT"/aiter_tuner-*.whl
DIST="$OUT" bash scripts/build_dist.sh >/dev/null
rm -f "$OUT"/aiter_tuner-*.tar.gz
pins=()
for name in tenacity urllib3; do
  pin=$(grep -i "^$name==" requirements-lock.txt) || { echo "no $name in requirements-lock.txt" >&2; exit 1; }
  pins+=("$pin")
done
pins+=("pip==$("$PY" -m pip --version | awk '{print $2}')")
"$PY" -m pip download -q --no-deps --only-binary=:all: --disable-pip-version-check -d "$OUT" "${pins[@]}"
ls "$OUT"
