#!/usr/bin/env bash
# Install into .venv (with the test extras) and run every test, on SQLite and on a real PostgreSQL
# started here on loopback. Without PostgreSQL the run fails loudly (TUNER_ALLOW_NO_PG=1 to run SQLite only).
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
[ -x .venv/bin/python ] || python3 -m venv .venv
# -c: the versions the suite was last run on (requirements-lock.txt, scripts/lock.sh writes it)
.venv/bin/pip install -q -c requirements-lock.txt -e '.[dev]'

# Browser tests drive Debian's Chromium through Playwright (no browser download of its own).
# apt_install PKG WHY [APT OPTIONS]: says what it installs and why before it does (the machine's package manager,
# as root)
apt_install() {
  local pkg=$1 why=$2
  shift 2
  echo "scripts/test.sh: apt-get install $* $pkg ($why)" >&2
  apt-get install -y -q "$@" "$pkg" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q "$@" "$pkg" >/dev/null; }
}
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null; then
  apt_install chromium "the browser tests drive it" || echo "!!!!! could not install chromium: browser tests will fail" >&2
fi
# Compose's own parser and validator for docker-compose.yml (tests/e2e/test_compose.py runs its `config`, which
# needs no engine): Debian's docker-compose, without the docker.io engine it recommends.
if ! command -v docker-compose >/dev/null && ! docker compose version >/dev/null 2>&1 && command -v apt-get >/dev/null
then
  apt_install docker-compose "tests/e2e/test_compose.py runs its config on docker-compose.yml" \
    --no-install-recommends || echo "!!!!! could not install docker-compose: the compose tests will fail" >&2
fi

# The launcher tests run real engines: a Docker engine (tests/e2e/test_docker_pool.py: Debian's docker.io, started
# here as `dockerd --bridge=none --iptables=false` when none answers; its containers use --network host, so no
# traffic leaves loopback) and a one-host Slurm cluster (tests/e2e/test_slurm_array.py starts munged, slurmctld and
# slurmd itself from Debian's slurm-wlm and munge).
if command -v apt-get >/dev/null; then
  if ! command -v dockerd >/dev/null; then
    apt_install docker.io "tests/e2e/test_docker_pool.py runs the worker pool on a real engine" \
      --no-install-recommends || echo "!!!!! could not install docker.io: the Docker pool tests will fail" >&2
  fi
  for pkg in munge slurm-wlm; do
    bin=$([ "$pkg" = munge ] && echo munged || echo slurmd)
    command -v "$bin" >/dev/null || [ -x "/usr/sbin/$bin" ] || apt_install "$pkg" \
      "tests/e2e/test_slurm_array.py runs a worker array on slurmctld + slurmd" --no-install-recommends \
      || echo "!!!!! could not install $pkg: the Slurm tests will fail" >&2
  done
fi
DOCKERD_PID=
if command -v dockerd >/dev/null && ! docker info >/dev/null 2>&1; then
  echo "scripts/test.sh: starting dockerd --bridge=none --iptables=false (no engine answered)" >&2
  dockerd --bridge=none --iptables=false >/tmp/tuner-dockerd.log 2>&1 &
  DOCKERD_PID=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || echo "!!!!! dockerd did not answer (/tmp/tuner-dockerd.log)" >&2
fi
stop_dockerd() { [ -z "$DOCKERD_PID" ] || { kill "$DOCKERD_PID" 2>/dev/null; wait "$DOCKERD_PID" 2>/dev/null || true; }; }

start_pg() {
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  if [ -z "$bin" ] && command -v apt-get >/dev/null; then
    apt_install postgresql "the tests' PostgreSQL, started on loopback and removed at exit" || true
    bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  fi
  [ -n "$bin" ] || return 1
  PGDATA=$(mktemp -d /tmp/tuner-pg.XXXXXX)
  local port run=()
  port=$(.venv/bin/python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
  if [ "$(id -u)" = 0 ]; then chown postgres "$PGDATA"; run=(runuser -u postgres --); fi
  "${run[@]}" "$bin/initdb" -D "$PGDATA" -A trust -U postgres >/dev/null
  "${run[@]}" "$bin/pg_ctl" -D "$PGDATA" -l "$PGDATA/log" -w -o \
    "-p $port -k $PGDATA -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off" start >/dev/null
  PG_STOP=("${run[@]}" "$bin/pg_ctl" -D "$PGDATA" -m fast stop)
  export TUNER_TEST_PG_URL="postgresql://postgres@127.0.0.1:$port/postgres"
}

trap stop_dockerd EXIT
if [ -z "${TUNER_TEST_PG_URL:-}" ]; then
  if start_pg; then
    trap '"${PG_STOP[@]}" >/dev/null 2>&1 || true; rm -rf "$PGDATA"; stop_dockerd' EXIT
    echo "PostgreSQL started for the tests at $TUNER_TEST_PG_URL"
  elif [ "${TUNER_ALLOW_NO_PG:-0}" = 1 ]; then
    echo "!!!!! PostgreSQL NOT AVAILABLE: running on SQLite only (TUNER_ALLOW_NO_PG=1) !!!!!" >&2
  else
    echo "!!!!! PostgreSQL NOT AVAILABLE: could not install or start it; refusing to pass on SQLite alone." >&2
    echo "!!!!! Set TUNER_TEST_PG_URL, or TUNER_ALLOW_NO_PG=1 to run SQLite only." >&2
    exit 1
  fi
fi
# Types first ([tool.mypy] in pyproject.toml): a type error fails the run before any test starts.
echo "mypy app workers"
.venv/bin/python -m mypy app workers
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
