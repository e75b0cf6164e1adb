#!/bin/bash
# Issue 50's "Done when" runs on a lent GPU, one list per process, one call each (sized by the measured cost:
# an exhaustive race is 35-70 s a large prefill shape on an H100, 4 s a headline shape).
# The confirmation races (--confirm) are left out: no figure of the goal is theirs, and they cost a third more.
# Usage: [P=shift] bash benchmarks/issue50_runs.sh faults|headline|new|modes [run]   (logs and JSON under $OUT;
#   P: the race's window placement, early_stop.py --placement, clone by default)
# Measured (H100, session 21): faults 30 s; headline 376-398 s with Triton's cache warm (+50 s in a machine's
# first process); new 329-380 s.
set +e
export PYTHONUNBUFFERED=1
python3 -c "import pynvml, pydantic" 2>/dev/null || {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; }
run=${2:-1}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv \
  >> $OUT/log_$1_$run.txt 2>&1
# a monitoring agent polling the card beside the race (must not read as contention)
nvidia-smi --query-gpu=timestamp,memory.used,clocks.sm,power.draw,temperature.gpu --format=csv -l 2 \
  > $OUT/smi_$1_$run.csv 2>&1 &
SMI=$!
case $1 in
  faults) timeout ${T:-170} python3 benchmarks/planted_faults.py --device cuda:0 --out $OUT/faults_$run.json ;;
  headline) timeout ${T:-560} python3 benchmarks/early_stop.py --device cuda:0 --shapes builtin \
      --shapes benchmarks/minimax_m3_untuned_gemm_bf16.csv --placement ${P:-clone} --out $OUT/headline_$run.json ;;
  new) timeout ${T:-580} python3 benchmarks/early_stop.py --device cuda:0 \
      --shapes benchmarks/issue50_new_large_bf16.csv --placement ${P:-clone} --out $OUT/new_$run.json ;;
  modes) timeout ${T:-240} python3 benchmarks/linear_modes.py --device cuda:0 --out $OUT/modes_$run.json ;;
esac >> $OUT/log_$1_$run.txt 2>&1
echo "=== $1 run $run rc=$?" >> $OUT/log_$1_$run.txt
kill $SMI
