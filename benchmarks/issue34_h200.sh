#!/bin/bash
# Issue 34's H200 runs. Usage: bash benchmarks/issue34_h200.sh A|B  (logs and JSON under $OUT)
set +e
export PYTHONUNBUFFERED=1
HEAD="--shapes builtin --shapes benchmarks/minimax_m3_untuned_gemm_bf16.csv"
NEW="--shapes benchmarks/new_shapes_bf16.csv"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $OUT/log.txt 2>&1
nvidia-smi --query-compute-apps=pid --format=csv >> $OUT/log.txt 2>&1
if [ "$1" = A ]; then
  CUDA_LAUNCH_BLOCKING=1 timeout 60 python3 benchmarks/smoke_gpu.py >> $OUT/log.txt 2>&1
  timeout 330 python3 benchmarks/early_stop.py --device cuda:0 $HEAD --confirm --budget-s 300 --out $OUT/head1.json >> $OUT/log.txt 2>&1
  echo "=== faults" >> $OUT/log.txt
  timeout 120 python3 benchmarks/planted_faults.py --device cuda:0 --out $OUT/faults.json >> $OUT/log.txt 2>&1
  echo "=== new 1" >> $OUT/log.txt
  timeout 130 python3 benchmarks/early_stop.py --device cuda:0 $NEW --confirm --budget-s 110 --out $OUT/new1.json >> $OUT/log.txt 2>&1
elif [ "$1" = C ]; then
  timeout 200 python3 benchmarks/early_stop.py --device cuda:0 --shapes benchmarks/issue34_misses_bf16.csv --confirm --out $OUT/misses.json >> $OUT/log.txt 2>&1
else
  timeout 330 python3 benchmarks/early_stop.py --device cuda:0 $HEAD --confirm --budget-s 300 --out $OUT/head2.json >> $OUT/log.txt 2>&1
  echo "=== new 2" >> $OUT/log.txt
  timeout 140 python3 benchmarks/early_stop.py --device cuda:0 $NEW --confirm --budget-s 120 --out $OUT/new2.json >> $OUT/log.txt 2>&1
fi
grep -E "early-stop:|confirm:|confirmation handed|head to head|halving decisions|sampled GPU|wall halving|compile lane:|Error|Traceback|budget reached" $OUT/log.txt | tail -40
# C: the shapes run A missed or confirmed differently, and the issue's M=200 N=8192 K=7392 confirmation case
