#!/bin/sh
# ab_gate.py where CPUs are free: every gate its own shard (own service, stand-ins, seeds 1000+g / 5000+g), all
# shards of RUNS identical runs side by side, then one summary per run. The per-gate lines and summaries land in OUT.
#   benchmarks/ab_gate_shards.sh OUT GATES RUNS [ab_gate.py flags...]   (PYTHON: the interpreter, python3; TIMEOUT: s a shard)
set -u
out=$1 gates=$2 runs=$3
shift 3
py=${PYTHON:-python3}
tmp=$(mktemp -d)
mkdir -p "$out"
for r in $(seq 1 "$runs"); do
  for g in $(seq 0 $((gates - 1))); do
    timeout "${TIMEOUT:-0}" "$py" benchmarks/ab_gate.py --first-gate "$g" --gates 1 "$@" >"$tmp/r$r-g$g.out" 2>"$tmp/r$r-g$g.err" &
  done
done
wait
for r in $(seq 1 "$runs"); do
  cat "$tmp"/r"$r"-g*.out | grep '^{"gate"' >"$out/run${r}_gates.jsonl"
  "$py" benchmarks/ab_gate.py --summarize "$out/run${r}_gates.jsonl" "$@" >"$out/run${r}_summary.json"
  for f in "$tmp"/r"$r"-g*.err; do [ -s "$f" ] && { echo "== $f"; tail -n 20 "$f"; }; done >>"$out/errors.txt"
done
exit 0
