#!/usr/bin/env bash
# Run the README's "Quick start on a CPU machine" lines as written, in a fresh copy of this checkout (tracked
# and untracked-but-not-ignored files; no .venv, no data/), and check it ends with an overlay downloaded.
# The one change: the service listens on a free port (TUNER_PORT / TUNER_SERVICE_URL, which `serve`,
# `example-capture` and the worker read) and the README's URL's 8000 is replaced by that port.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${QUICKSTART_DIR:-$(mktemp -d /tmp/quickstart.XXXXXX)}"
mkdir -p "$WORK"
git -C "$ROOT" ls-files -co --exclude-standard -z | tar -C "$ROOT" --null -T - --ignore-failed-read -cf - \
  | tar -xf - -C "$WORK"
PORT=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
unset $(compgen -e | grep -E '^(TUNER_|DATABASE_URL$|VIRTUAL_ENV$)') 2>/dev/null || true  # a newcomer's shell
export TUNER_PORT=$PORT TUNER_SERVICE_URL="http://127.0.0.1:$PORT"

# The commands, exactly as the README shows them (continuation lines joined by bash itself).
sed -n '/<!-- quickstart:begin -->/,/<!-- quickstart:end -->/p' "$ROOT/README.md" | sed '1d;$d' \
  | sed 's/^    //; s#127\.0\.0\.1:8000#127.0.0.1:'"$PORT"'#g' > "$WORK/quickstart.sh"
echo "== running in $WORK (port $PORT):"; cat "$WORK/quickstart.sh"

cd "$WORK"
# `source` so the README's `serve &` is a job of this shell, stopped on exit
trap 'kill "${SERVER:-%1}" 2>/dev/null || true' EXIT  # the README sets SERVER=$! for its `kill $SERVER`
set -x
source ./quickstart.sh
set +x

echo "== checks"
[ -n "${SERVER:-}" ] && kill -0 "$SERVER" || { echo "the README's \$SERVER is not the running service"; exit 1; }
# the README's other points (issue 27), kept: no nproc (OMP_NUM_THREADS changes it), no kill %1, $NEW set before
# use, no index's aiter-tuner (an unclaimed name), a Kubernetes pod that asks for a GPU and sets $MODEL
R="$ROOT/README.md"
! grep -qE 'nproc\)|kill %1' "$R" || { echo "README: nproc or kill %1 is back"; exit 1; }
grep -q 'NEW=$(curl' "$R" || { echo "README: \$NEW is used but never set"; exit 1; }
! grep -qE "pip install( +-[-a-z]+)* +['\"]?aiter-tuner([^_a-z0-9]|\$)" "$R" \
  || { echo "README: installs aiter-tuner from a package index"; exit 1; }
grep -q 'amd.com/gpu' "$R" && grep -q 'name: MODEL' "$R" || { echo "README: the pod lacks a GPU or MODEL"; exit 1; }
grep -q 'apt_install chromium' "$ROOT/scripts/test.sh" && grep -q 'apt_install docker-compose' "$ROOT/scripts/test.sh" \
  || { echo "test.sh installs silently"; exit 1; }
# serve.sh holds port 8000 until stopped; it installs the tested versions too; a CUDA worker's identity is said
grep -q 'stop it before the quick start' "$R" || { echo "README: serve.sh's server would hold port 8000"; exit 1; }
grep -q -- '-c requirements-lock.txt' "$ROOT/scripts/serve.sh" || { echo "serve.sh ignores the lock"; exit 1; }
grep -q 'sm_90' "$R" || { echo "README: a CUDA worker's identity (sm_90/132) is undocumented"; exit 1; }
# the README's early-stop commands are the one benchmarks/RESULTS.md ran (less its --out)
python3 - "$R" "$ROOT/benchmarks/RESULTS.md" <<'PY'
import re, sys
def cmds(path):
    text = re.sub(r"\\?\n\s*", " ", open(path).read())
    return {" ".join(re.sub(r"--out \S+", "", c).split())
            for c in re.findall(r"python3 benchmarks/early_stop\.py[^`#(]*", text)}
readme, results = cmds(sys.argv[1]), cmds(sys.argv[2])
assert readme and readme <= results, f"README's early_stop.py commands {readme} are not RESULTS.md's {results}"
PY
# the torch extra is a range: a GPU machine's own torch build satisfies it and stays
python3 - "$ROOT/pyproject.toml" <<'PY'
import sys, tomllib
torch = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["torch"]
assert not any("==" in r for r in torch), f"the torch extra pins an exact version: {torch}"
PY
# the console scripts, never `python -m workers` (a working directory holding its own `app` package shadows ours)
! grep -qE '(python3?|\.venv/bin/python) -m workers( |\.verify)' "$R" || { echo "README: python -m workers"; exit 1; }
TUNER_CU_NUM=304x .venv/bin/aiter-tuner token list >/dev/null  # a malformed value stops only `capture`
if TUNER_CU_NUM=304x .venv/bin/aiter-tuner capture --once 2>cu.err; then exit 1; fi
grep -q TUNER_CU_NUM cu.err || { cat cu.err; exit 1; }
# TUNER_HOST is where `serve` listens, never the capture agent's name for its server (that is TUNER_HOSTNAME)
TUNER_HOST=203.0.113.7 .venv/bin/python -c "
import argparse; from app.capture.agent import add_arguments
p = argparse.ArgumentParser(); add_arguments(p); assert p.parse_args([]).host != '203.0.113.7'"
rows=$(($(wc -l < bf16_tuned_gemm.csv) - 1))
head -1 bf16_tuned_gemm.csv | grep -q '^gfx,cu_num,M,N,K' || { echo "overlay header unexpected"; exit 1; }
.venv/bin/python - <<PY
import importlib.metadata as md, httpx
import torch
assert torch.__version__.endswith("+cpu"), f"the torch extra took {torch.__version__}, not the CPU build"
cuda = [d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].lower().startswith("nvidia")]
assert not cuda, f"CUDA packages installed: {cuda}"
url = "http://127.0.0.1:$PORT"
camp = httpx.get(url + "/v1/campaigns/1").json()
assert camp["tuned"] == 3, f"every example shape tuned: {camp}"
# the overlay holds a row for each shape whose winner beat the default by AITER's margin
assert camp["tuned_with_row"] == $rows, (camp["tuned_with_row"], $rows)
home = httpx.get(url + "/").text
assert "/campaigns/" in home, home[:500]
page = httpx.get(url + "/campaigns/1").text
assert "CPU time" in page and "GPU time" not in page, "the dashboard names the CPU's time"
assert "swagger-ui" in httpx.get(url + "/docs").text
# /docs' Authorize button: a bearer scheme in the OpenAPI; /redoc fetches nothing from another host
assert httpx.get(url + "/openapi.json").json()["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
redoc = httpx.get(url + "/redoc").text
js = "".join(httpx.get(url + src).text for src in __import__("re").findall(r'<script src="([^"]+)"', redoc))
assert "googleapis" not in redoc and "cdn.redoc.ly" not in js and js, "ReDoc loads from a CDN"
# a header-only overlay says why, and offers no AITER_CONFIG line to set
if $rows == 0:
    assert "Nothing to deploy yet" in page and 'id="envline"' not in page, page
# the deploy plan offers no form its own notes say would replace the shipped table
plan = httpx.get(url + "/v1/overlays/sha256:" + "0" * 63 + "1/bf16_gemm/deploy").json()
assert plan["shipped_tables_known"] or "layer" not in plan["offered"], plan
# the plot's last point is the page's served time covered
from app.db.session import Database
from app.services import campaigns
db = Database("sqlite:///data/tuner.db")
with db.session(write=False) as s:
    last = campaigns.coverage_points(s, 1)[-1][1]
assert abs(last - camp["served_time_covered"]) < 1e-9, (last, camp["served_time_covered"])
print(f"quickstart OK: 3 shapes tuned, overlay downloaded with $rows rows; torch {torch.__version__}")
PY
