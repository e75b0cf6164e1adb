#!/usr/bin/env bash
# Install into .venv and start the service on its embedded SQLite default (./data/tuner.db),
# then post a tiny example capture so the campaign list shows something. Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${PORT:-8000}"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q -c requirements-lock.txt -e '.[server]'  # the tested versions
.venv/bin/aiter-tuner serve --host 127.0.0.1 --port "$PORT" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null' EXIT INT TERM
for _ in $(seq 100); do
  .venv/bin/python -c "import httpx,sys; httpx.get('http://127.0.0.1:$PORT/healthz').raise_for_status()" \
    2>/dev/null && break
  sleep 0.2
done
.venv/bin/aiter-tuner example-capture --service "http://127.0.0.1:$PORT"
echo "service running on http://127.0.0.1:$PORT (campaigns: /v1/campaigns, API docs: /docs)"
wait $SERVER
