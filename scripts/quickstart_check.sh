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
trap 'kill %1 2>/dev/null || true' EXIT
set -x
source ./quickstart.sh
set +x

echo "== checks"
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
print(f"quickstart OK: 3 shapes tuned, overlay downloaded with $rows rows; torch {torch.__version__}")
PY
