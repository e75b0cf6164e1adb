#!/usr/bin/env bash
# Build the sdist and, from that sdist (as pip would), the wheel into ${DIST:-dist}/:
#   aiter_tuner-<version>.tar.gz and aiter_tuner-<version>-py3-none-any.whl
# with the Python of .venv (PYTHON=... for another), its setuptools and no download (no build isolation).
# The wheel carries the service (app/, its migrations and web assets) and the worker (workers/): install it
# with `pip install 'dist/aiter_tuner-<version>-py3-none-any.whl[server]'` (or [worker], [postgres], ...).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
DIST="$(mkdir -p "${DIST:-dist}" && cd "${DIST:-dist}" && pwd)"
sdist=$("$PY" -c "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))" "$DIST" \
  | tail -1)
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DIST" "$DIST/$sdist"
ls "$DIST"/aiter_tuner-*
