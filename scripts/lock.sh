#!/usr/bin/env bash
# Write requirements-lock.txt: the exact versions of every package in .venv (the one scripts/test.sh installed
# and ran the tests on), for `pip install -c requirements-lock.txt ...` to install what was tested. Local build
# labels are dropped (torch 2.13.0+cpu -> ==2.13.0, which the CPU build and a GPU build of 2.13.0 both satisfy).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
{
  echo "# The versions scripts/test.sh last passed with ($("$PY" -c 'import sys; print(sys.version.split()[0])'),"
  echo "# $(uname -m)); constraints, not requirements: pip install -c requirements-lock.txt -e '.[dev]'."
  echo "# Rebuilt by scripts/lock.sh from the tested .venv."
  "$PY" -m pip freeze --exclude-editable --all | grep -v -E '^(aiter-tuner|pip|setuptools|wheel)==' \
    | sed -E 's/^([A-Za-z0-9_.-]+==[^+ ]+)\+[A-Za-z0-9.]+/\1/'
} > requirements-lock.txt
echo "wrote requirements-lock.txt ($(grep -vc '^#' requirements-lock.txt) packages)"
