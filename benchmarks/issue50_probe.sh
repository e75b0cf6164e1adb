#!/bin/bash
# Issue 50 probes on a lent GPU: the busy check against the card's own state, and where the race runs out of
# memory on a large prefill shape. Usage: bash benchmarks/issue50_probe.sh  (logs under $OUT)
set +e
export PYTHONUNBUFFERED=1
# the worker's own imports (pydantic) and torch.cuda.clock_rate's pynvml (nvidia-ml-py): carried as wheels in
# .whl where the image lacks them
python3 -c "import pynvml, pydantic" 2>/dev/null || {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; }
python3 -c "import torch; print('torch.cuda.clock_rate', torch.cuda.clock_rate(0))" > $OUT/probe0.log 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit --format=csv \
  > $OUT/probe.log 2>&1
cat $OUT/probe0.log >> $OUT/probe.log
timeout 200 python3 benchmarks/busy_clocks.py --heavy-s 60 > $OUT/busy_clocks.jsonl 2>>$OUT/probe.log
echo "=== oom shape" >> $OUT/probe.log
timeout 240 python3 - >> $OUT/probe.log 2>&1 <<'PY'
import sys, time, torch, traceback
sys.path.insert(0, ".")
from workers.backends.torch_race import TorchBackend
from workers.backends.base import Batch
shape = {"M": "6144", "N": "12288", "K": "1536", "bias": "False", "dtype": "torch.bfloat16",
         "outdtype": "torch.bfloat16", "scaleAB": "False", "bpreshuffle": "False"}
lease = {"gfx": "h100", "cu_num": 132, "tuned_header": ["M", "N", "K"], "shapes": [{"shape_id": 1, "shape": shape}]}
for kind in ("halving", "exhaustive"):
    torch.cuda.reset_peak_memory_stats()
    b = TorchBackend("cuda:0", race=kind, busy_drift=None)
    batch = Batch(lease, time.monotonic() + 1e6, lambda: False)
    t0 = time.monotonic()
    try:
        res = b.tune(batch, lease["shapes"][0])
        print(kind, "status", res.status, "kernel", res.kernel_name, "err", (res.error or "")[:200],
              "memory", (res.race or {}).get("memory"))
        print(kind, "failed candidates", [(c["name"], c["error"][:80]) for c in res.candidates if c["error"]])
    except BaseException as ex:
        print(kind, "RAISED", type(ex).__name__, str(ex)[:300]); traceback.print_exc(limit=8)
    print(kind, f"{time.monotonic()-t0:.1f}s peak allocated {torch.cuda.max_memory_allocated()/2**30:.2f} GiB "
          f"reserved {torch.cuda.max_memory_reserved()/2**30:.2f} GiB")
    del b
    torch.cuda.empty_cache()
PY
tail -30 $OUT/probe.log
