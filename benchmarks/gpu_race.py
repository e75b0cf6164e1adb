"""Race the torch backend's candidates (library GEMM vs Triton tiles/split-K) on real LLM GEMM shapes and
print winner vs default per shape. Run on a GPU: python benchmarks/gpu_race.py --device cuda:0 [--out f.json]"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.domain.families import FAMILIES  # noqa: E402
from app.domain.shapes import make_shape  # noqa: E402
from workers.backends.base import Batch  # noqa: E402
from workers.backends.torch_race import TorchBackend  # noqa: E402
from workers.identity import detect  # noqa: E402

# (N, K) of Llama-3-70B-style projections at TP8 and a DeepSeek-style shape, decode to prefill M
NK = [(1280, 8192), (8192, 1024), (7168, 2048), (3584, 8192)]
MS = [1, 8, 32, 128, 512, 2048, 8192]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--out")
    a = p.parse_args()
    ident = detect(int(a.device.split(":")[1]) if a.device.startswith("cuda") else None)
    fam = FAMILIES["bf16_gemm"]
    items = [{"shape_id": i, "shape": make_shape(fam, {"M": m, "N": n, "K": k}).as_dict()}
             for i, (m, (n, k)) in enumerate((m, nk) for nk in NK for m in MS)]
    lease = {"gfx": ident.gfx, "cu_num": ident.cu_num, "tuned_header": list(fam.tuned_header), "shapes": items}
    backend = TorchBackend(device=a.device, repeats=a.repeats, warmup=5, candidate_limit_s=20)
    out: list = []
    t0 = time.perf_counter()
    backend.run(Batch(lease, time.monotonic() + 1e6, lambda: False), out.append)
    wall = time.perf_counter() - t0
    print(f"device={a.device} gfx={ident.gfx} cu_num={ident.cu_num} shapes={len(out)} wall={wall:.1f}s")
    print(f"{'M':>5} {'N':>5} {'K':>5} {'default us':>10} {'best us':>9} {'speedup':>7} {'fail':>4}  winner")
    rows = []
    for r in out:
        s = next(x["shape"] for x in items if x["shape_id"] == r.shape_id)
        failed = sum(1 for c in r.candidates if c.get("error") or (c.get("err_ratio") or 0) > 0.05)
        sp = (r.default_us / r.us) if (r.us and r.default_us) else float("nan")
        print(f"{s['M']:>5} {s['N']:>5} {s['K']:>5} {r.default_us or float('nan'):10.2f} {r.us or float('nan'):9.2f} "
              f"{sp:7.2f} {failed:4d}  {r.kernel_name} {r.status} {r.error or ''}")
        rows.append({"shape": s, "status": r.status, "winner": r.kernel_name, "us": r.us, "default_us": r.default_us,
                     "elapsed_s": r.elapsed_s, "candidates": r.candidates})
    ok = [x for x in rows if x["us"] and x["default_us"]]
    if ok:
        import statistics
        sps = [x["default_us"] / x["us"] for x in ok]
        print(f"geomean speedup over torch_linear: {statistics.geometric_mean(sps):.3f}; "
              f"shapes where a non-default kernel won: {sum(x['winner'] != 'torch_linear' for x in ok)}/{len(ok)}")
    if a.out:
        Path(a.out).write_text(json.dumps({"wall_s": wall, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
