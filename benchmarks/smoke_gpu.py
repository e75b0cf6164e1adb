"""A short GPU smoke of the race's capture windows, guard and control kernel (library candidates only, no
Triton compile): python benchmarks/smoke_gpu.py"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from app.domain.families import FAMILIES  # noqa: E402
from app.domain.shapes import make_shape  # noqa: E402
from workers.backends.base import Batch  # noqa: E402
from workers.backends.torch_race import TorchBackend  # noqa: E402

fam = FAMILIES["bf16_gemm"]
items = [{"shape_id": i + 1, "shape": make_shape(fam, {"M": m, "N": n, "K": k, "bias": bias}).as_dict()}
         for i, (m, n, k, bias) in enumerate([(1, 1280, 8192, False), (512, 5120, 2880, True)])]
lease = {"gfx": "sm_90", "cu_num": 132, "tuned_header": list(fam.tuned_header), "shapes": items}
for race in ("exhaustive", "halving"):
    b = TorchBackend(device="cuda:0", race=race, repeats=30,
                     only=["torch_linear", "torch_mm_bt_contig", "torch_splitk2_fp32acc", "torch_splitk4_fp32acc"])
    out = []
    b.run(Batch(lease, time.monotonic() + 1e6, lambda: False), out.append)
    for r in out:
        print(race, r.shape_id, r.status, r.kernel_name, r.us, r.confidence, r.spread, r.timing, r.error, flush=True)
