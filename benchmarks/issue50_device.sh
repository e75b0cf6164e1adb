#!/bin/bash
# Issue 50 on a lent GPU, one call: the race on the three prefill shapes that ran an H100 out of memory (each
# race's peak GPU memory against the bound it stated), the four planted faults, and the busy check on an idle
# card with nvidia-smi polling it every 2 s (a monitoring agent). Usage: bash benchmarks/issue50_device.sh
set +e
export PYTHONUNBUFFERED=1
python3 -c "import pynvml, pydantic" 2>/dev/null || {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv > $OUT/log.txt 2>&1
nvidia-smi --query-gpu=timestamp,memory.used,clocks.sm,power.draw,temperature.gpu --format=csv -l 2 \
  > $OUT/smi.csv 2>&1 &
SMI=$!
echo "=== big shapes" >> $OUT/log.txt
timeout 300 python3 benchmarks/early_stop.py --device cuda:0 --shapes benchmarks/issue50_oom_shapes_bf16.csv \
  --confirm --out $OUT/big.json >> $OUT/log.txt 2>&1
echo "=== faults rc=$?" >> $OUT/log.txt
timeout 150 python3 benchmarks/planted_faults.py --device cuda:0 --out $OUT/faults.json >> $OUT/log.txt 2>&1
echo "=== done rc=$?" >> $OUT/log.txt
kill $SMI
grep -E "peak GiB|raced to the end|early-stop:|busy|failed|Error|Traceback|caught|fault|=== " $OUT/log.txt | tail -40
