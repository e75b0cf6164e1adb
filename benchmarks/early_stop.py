"""Exhaustive race vs the successive-halving race, same shapes, same candidates, one GPU, one run.

For every shape both races run on the same inputs (the order alternates shape by shape); Triton configs are
compiled once up front (timed apart), so neither race pays compiles the other already paid. The halving
winner is judged by the exhaustive race's own timing of that kernel: within 1% of the exhaustive fastest.
Run on a GPU: python benchmarks/early_stop.py --device cuda:0 [--out f.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.domain.families import FAMILIES  # noqa: E402
from app.domain.shapes import make_shape  # noqa: E402
from workers.backends.base import Batch  # noqa: E402
from workers.backends.torch_race import DEFAULT, Schedule, TorchBackend, candidates  # noqa: E402
from workers.identity import detect  # noqa: E402

# (N, K, bias) from AITER's shipped model_configs shape lists (aiter/configs/model_configs/*bf16*untuned*.csv):
# copied here because the GPU machine gets only this working tree.
NK = [
    (1280, 8192, False), (8192, 1024, False), (7168, 8192, False), (8192, 3584, False), (192, 1024, False),  # llama70B
    (2304, 16384, False), (16384, 2048, False),                                                            # llama405B
    (800, 5120, False), (5120, 640, False), (6400, 5120, False),                                           # qwen32B
    (2112, 7168, False), (3072, 1536, False), (256, 7168, False),                                          # dsv3
    (2304, 1536, False), (7168, 768, False),                                                               # kimik3
    (5120, 2880, True), (640, 2880, True),                                                                 # gptoss
    (4096, 2048, False),                                                                                   # glm5
]
MS = [1, 8, 32, 128, 512, 2048]
# other halving schedules, raced on the same shapes alongside the default one (figures apart, never in the line)
VARIANTS = {"wide": ((3, 1 / 3), (9, 1 / 3)), "narrow": ((1, 0.05),)}


def shapes() -> list[dict]:
    fam = FAMILIES["bf16_gemm"]
    items = []
    for i, (n, k, bias) in enumerate(NK):
        for j in range(3):  # three M per (N, K), every M value nine times over the list
            m = MS[(i + 2 * j) % len(MS)]
            s = make_shape(fam, {"M": m, "N": n, "K": k, "bias": bias}).as_dict()
            items.append({"shape_id": len(items) + 1, "shape": s})
    return items


def head_to_head(backend: TorchBackend, item: dict, inputs: tuple, mine: str, theirs: str, n: int) -> float:
    """The two picks re-timed side by side (fresh buffers, interleaved, L2 flushed): mine / theirs."""
    from workers.backends.torch_race import Entry
    a, b, bias = inputs
    by = {c.name: c for c in candidates(a, b, bias, a.dtype)}
    es = [Entry(by[mine]), Entry(by[theirs])]
    if not all(backend._prepare(e) for e in es):
        return math.inf
    backend.timer.sample([e.replay for e in es], backend.warmup)  # type: ignore[misc]
    backend._sample(es, n, final=True)
    return es[0].median / es[1].median


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--limit", type=int, default=0, help="only the first N shapes by size (smoke tests)")
    p.add_argument("--variants", default="", help="comma-separated extra schedules from VARIANTS")
    p.add_argument("--budget-s", type=float, default=1e9, help="take no new shape after this many seconds")
    p.add_argument("--out")
    a = p.parse_args()
    import torch
    ident = detect(int(a.device.split(":")[1]) if a.device.startswith("cuda") else None)
    fam = FAMILIES["bf16_gemm"]
    items = shapes()
    if a.limit:
        items = sorted(items, key=lambda x: int(x["shape"]["M"]) * int(x["shape"]["N"]) * int(x["shape"]["K"]))
        items = items[:a.limit]
    lease = {"gfx": ident.gfx, "cu_num": ident.cu_num, "tuned_header": list(fam.tuned_header), "shapes": items}
    backend = TorchBackend(device=a.device, repeats=a.repeats, warmup=5, candidate_limit_s=20)
    batch = Batch(lease, time.monotonic() + 1e6, lambda: False)
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = "absent"
    print(f"torch {torch.__version__}, triton {tv}, device={a.device} "
          f"{torch.cuda.get_device_name() if a.device.startswith('cuda') else 'cpu'} gfx={ident.gfx}", flush=True)

    t0 = time.perf_counter()  # compile lane: every config once, with and without bias, before any race
    for bias in sorted({s["shape"]["bias"] for s in items}):
        x, w, bv = backend.inputs(dict(items[0]["shape"], M="64", bias=bias))
        for c in candidates(x, w, bv, x.dtype):
            try:
                c.fn()
            except Exception as e:  # noqa: BLE001
                print(f"compile: {c.name} failed: {type(e).__name__}: {str(e)[:120]}")
    backend.timer.sync()
    compile_s = time.perf_counter() - t0
    print(f"compile lane: {compile_s:.1f} s", flush=True)

    rows = []
    default_schedule = backend.schedule
    schedules = {"halving": default_schedule}
    schedules.update({v: Schedule(rounds=VARIANTS[v], final=a.repeats) for v in a.variants.split(",") if v})
    extra: dict[str, list[dict]] = {v: [] for v in schedules if v != "halving"}
    t_start = time.perf_counter()
    for i, item in enumerate(items):
        if time.perf_counter() - t_start > a.budget_s:
            print(f"budget reached: {len(rows)} of {len(items)} shapes raced", flush=True)
            break
        inputs = backend.inputs(item["shape"])
        got = {}
        kinds = ["exhaustive", *schedules]
        for kind in (kinds if i % 2 == 0 else kinds[::-1]):
            backend.schedule = schedules.get(kind, default_schedule)
            t = time.perf_counter()
            res = backend.tune(batch, item, kind="exhaustive" if kind == "exhaustive" else "halving", inputs=inputs)
            got[kind] = (res, time.perf_counter() - t)
        backend.schedule = default_schedule
        (ex, ex_wall), (hv, hv_wall) = got["exhaustive"], got["halving"]
        ex_us = {c["name"]: c["us"] for c in ex.candidates if c["us"] is not None and c["err_ratio"] is not None
                 and c["err_ratio"] <= 0.05}
        best = min(ex_us.values())
        fastest = ex.race["fastest"]
        win_us = ex_us[ex.kernel_name]
        for v in extra:
            res, wall = got[v]
            extra[v].append({"by_ex": ex_us.get(res.kernel_name, math.inf), "best": best, "win_us": win_us,
                             "sampled_s": res.race["sampled_s"], "wall_s": wall, "ex_sampled_s": ex.race["sampled_s"],
                             "ex_wall_s": ex_wall, "same": res.kernel_name == ex.kernel_name})
        hv_by_ex = ex_us.get(hv.kernel_name, math.inf)
        referee = 1.0 if hv.kernel_name == ex.kernel_name else head_to_head(backend, item, inputs, hv.kernel_name,
                                                                            ex.kernel_name, a.repeats)
        s = item["shape"]
        rows.append({"M": int(s["M"]), "N": int(s["N"]), "K": int(s["K"]), "bias": s["bias"],
                     "candidates": len(ex.candidates), "ex_fastest": fastest, "ex_winner": ex.kernel_name,
                     "ex_us": best, "ex_win_us": win_us, "default_us": ex_us.get(DEFAULT), "hv_winner": hv.kernel_name,
                     "hv_us_by_ex": hv_by_ex, "hv_us": hv.us, "hv_default_us": hv.default_us,
                     "ex_status": ex.status, "hv_status": hv.status,
                     "ex_sampled_s": ex.race["sampled_s"], "hv_sampled_s": hv.race["sampled_s"],
                     "ex_samples": ex.race["samples"], "hv_samples": hv.race["samples"],
                     "hv_finalists": hv.race["finalists"], "ex_wall_s": ex_wall, "hv_wall_s": hv_wall,
                     "sigma": ex.race["sigma"], "referee": referee, "ex_candidates": ex.candidates, "hv_candidates": hv.candidates})
        r = rows[-1]
        print(f"{r['M']:>5} {r['N']:>6} {r['K']:>6} c={r['candidates']:>2} ex={fastest:<34} {best:9.2f}us "
              f"hv={hv.kernel_name:<34} {hv_by_ex / best:6.3f} fin={r['hv_finalists']:>2} "
              f"gpu {r['hv_sampled_s'] / r['ex_sampled_s']:.3f} wall {hv_wall:5.2f}/{ex_wall:5.2f}s "
              f"{hv.status}", flush=True)

    n = len(rows)
    same = sum(r["hv_winner"] == r["ex_winner"] for r in rows)
    same_fastest = sum(r["hv_winner"] == r["ex_fastest"] for r in rows)
    within = sum(r["hv_us_by_ex"] <= 1.01 * r["ex_win_us"] for r in rows)
    within_fastest = sum(r["hv_us_by_ex"] <= 1.01 * r["ex_us"] for r in rows)
    gpu = sum(r["hv_sampled_s"] for r in rows) / sum(r["ex_sampled_s"] for r in rows)
    wall = sum(r["hv_wall_s"] for r in rows) / sum(r["ex_wall_s"] for r in rows)
    sp_ex = statistics.geometric_mean([r["default_us"] / r["ex_us"] for r in rows if r["default_us"]])
    sp_hv = statistics.geometric_mean([r["default_us"] / r["hv_us_by_ex"] for r in rows if r["default_us"]])
    rows_ex = sum(r["ex_status"] == "ok" for r in rows)
    rows_hv = sum(r["hv_status"] == "ok" for r in rows)
    cands = [r["candidates"] for r in rows]
    print()
    print(f"shapes {n}; candidates per shape {min(cands)}..{max(cands)}; Triton compile lane {compile_s:.1f} s")
    print(f"exhaustive: wall {sum(r['ex_wall_s'] for r in rows):.1f} s ({sum(r['ex_wall_s'] for r in rows) / n:.2f} "
          f"s/shape), sampled GPU {sum(r['ex_sampled_s'] for r in rows):.2f} s, samples {sum(r['ex_samples'] for r in rows)}")
    print(f"halving:    wall {sum(r['hv_wall_s'] for r in rows):.1f} s ({sum(r['hv_wall_s'] for r in rows) / n:.2f} "
          f"s/shape), sampled GPU {sum(r['hv_sampled_s'] for r in rows):.2f} s, samples {sum(r['hv_samples'] for r in rows)}, "
          f"finalists per shape {statistics.mean(r['hv_finalists'] for r in rows):.1f}")
    print(f"same winner (after the tie rule) {same}/{n}; halving picked the exhaustive fastest {same_fastest}/{n}")
    print(f"winner vs default (torch_linear) geomean, by the exhaustive timings: exhaustive fastest {sp_ex:.3f}, "
          f"halving winner {sp_hv:.3f}")
    print(f"rows that help (>= 3% over the default): exhaustive {rows_ex}/{n}, halving {rows_hv}/{n}; "
          f"the rest 'default is best'")
    print(f"median per-sample sigma {statistics.median(r['sigma'] for r in rows if r['sigma'] is not None):.4f}")
    print(f"within 1% of the exhaustive winner (its tie rule applied) {within}/{n}; "
          f"within 1% of the exhaustive fastest (no tie rule) {within_fastest}/{n}")
    for v, xs in extra.items():
        print(f"schedule {v} {VARIANTS[v]}: sampled GPU ratio "
              f"{sum(x['sampled_s'] for x in xs) / sum(x['ex_sampled_s'] for x in xs):.3f}; wall ratio "
              f"{sum(x['wall_s'] for x in xs) / sum(x['ex_wall_s'] for x in xs):.3f}; within 1% "
              f"{sum(x['by_ex'] <= 1.01 * x['win_us'] for x in xs)}/{len(xs)} (of the fastest "
              f"{sum(x['by_ex'] <= 1.01 * x['best'] for x in xs)}); same winner {sum(x['same'] for x in xs)}")
    differ = [r for r in rows if r["hv_winner"] != r["ex_winner"]]
    print(f"head to head (the two picks re-timed together, interleaved, where they differ): halving pick within 1% "
          f"of the exhaustive pick on {sum(r['referee'] <= 1.01 for r in rows)}/{n} shapes "
          f"({len(differ)} differing picks; worst {max([r['referee'] for r in differ] or [1.0]):.3f})")
    print(f"halving schedule {default_schedule}")
    print(f"early-stop: sampled GPU ratio {gpu:.3f}; wall ratio {wall:.3f}; within 1% {within}/{n} shapes")
    if a.out:
        Path(a.out).write_text(json.dumps({"compile_s": compile_s, "rows": rows, "variants": extra}, indent=1))


if __name__ == "__main__":
    main()
