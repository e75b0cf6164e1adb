"""Exhaustive race vs the successive-halving race, same shapes, same candidates, one GPU, one run.

For every shape both races run on the same inputs (the order rotates shape by shape); the worker's compile
lane (TorchBackend.warm) builds every Triton config once up front (timed apart), so neither race pays
compiles the other already paid. Two ways to judge the halving pick against the exhaustive pick:
- head to head (the goal line): where the two picks differ, both are re-timed together in this process, each
  as two fresh captures with their own buffers, interleaved in a shuffled order, L2 flushed before every
  sample; the halving pick is within 1% when its mean median is <= 1.01 x the exhaustive pick's;
- cross-race: the halving pick's time as the exhaustive race measured it. This also counts the noise between
  two separate races, which is no error of the screening: `--repeat-exhaustive` runs a second exhaustive race
  and prints the same figure for it (the ceiling of that measure) and how far kernel/default ratios move
  between the two.
Shapes: `--shapes builtin` (the 54 below, the default) and/or `--shapes FILE` (an AITER untuned CSV), repeatable.
Figures per shape (median, p90 of halving/exhaustive wall and sampled GPU) beside the ratios of sums.
`--confirm` (issue 24) also runs, per shape, a confirmation race (the default, the incumbent = the halving
winner, and the halving race's top 3 finalists) and judges it against the halving race (cost, head to head);
then an "upgrade": the winning Triton configs of every other shape won by one are dropped from the candidates,
every shape is leased again with its incumbent and finalists, and exactly the shapes whose incumbent is gone
must be raced in full (the rest confirmed).
Run on a GPU: python benchmarks/early_stop.py --device cuda:0 [--shapes FILE] [--confirm] [--out f.json]
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.domain.families import FAMILIES  # noqa: E402
from app.domain.shapes import make_shape  # noqa: E402
from app.domain.tables import read_table  # noqa: E402
from workers.backends.base import Batch, GpuBusy  # noqa: E402
from workers.backends.torch_decide import confidence  # noqa: E402
from workers.backends.torch_race import (_DTYPES, DEFAULT, Entry, Race, Schedule, TorchBackend,  # noqa: E402
                                         candidates, versus)
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
VARIANTS = {"wide": ((3, 1 / 3, 20), (9, 1 / 3, 6)), "narrow": ((1, 0.05, 3),)}


def builtin_shapes() -> list[dict]:
    fam = FAMILIES["bf16_gemm"]
    out = []
    for i, (n, k, bias) in enumerate(NK):
        for j in range(3):  # three M per (N, K), every M value nine times over the list
            m = MS[(i + 2 * j) % len(MS)]
            out.append(make_shape(fam, {"M": m, "N": n, "K": k, "bias": bias}).as_dict())
    return out


def file_shapes(path: str) -> list[dict]:
    """An AITER untuned CSV (aiter/configs/*untuned*.csv: M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle)."""
    fam = FAMILIES["bf16_gemm"]
    table = read_table(Path(path).read_text(), path)
    return [make_shape(fam, {c: r[c] for c in fam.shape_columns if c in r}, f"{path}:{i + 2}").as_dict()
            for i, r in enumerate(table.rows)]


def shapes(sources: list[str]) -> list[dict]:
    got: dict[tuple, dict] = {}
    for src in sources:
        for s in (builtin_shapes() if src == "builtin" else file_shapes(src)):
            got.setdefault(tuple(sorted(s.items())), s)  # a shape twice is raced once
    return [{"shape_id": i + 1, "shape": s} for i, s in enumerate(got.values())]


REFEREE_CAPTURES = 5


def head_to_head(backend: TorchBackend, item: dict, inputs: tuple, mine: str, theirs: str, n: int,
                 captures: int = REFEREE_CAPTURES) -> dict:
    """The two picks re-timed side by side with the race's own capture-aware rule (TorchBackend._final): in
    `captures` windows, each a fresh capture of both over fresh copies of the inputs, guarded, interleaved with
    the control kernel (a busy window is timed again). ratio: the median over windows of mine's window median /
    theirs; slower_conf: the race's confidence (sign test or paired t-test, torch_decide.confidence) that mine is
    the slower (>= 0.95: separated across captures)."""
    if mine == theirs:
        return {"ratio": 1.0, "windows": 0, "slower_in": 0, "slower_conf": 0.0}
    a, b, bias = inputs
    dt = _DTYPES[item["shape"]["outdtype"]]
    by = {c.name: c for c in candidates(a, b, bias, dt)}
    es = [Entry(by[mine]), Entry(by[theirs])]
    ref = a.double() @ b.double().t() + (bias.double() if bias is not None else 0)
    backend._inputs, backend._check_ref = (a, b, bias, dt, ref), (ref, dt)
    try:
        backend._final(Race(es, "referee"), es, n, windows=captures)
    finally:
        backend._inputs = backend._check_ref = None
    if any(e.error for e in es):
        return {"ratio": math.inf, "windows": 0, "slower_in": 0, "slower_conf": 1.0,
                "error": "; ".join(f"{e.name}: {e.error}" for e in es if e.error)}
    r, faster, k = versus(es[0], es[1])
    return {"ratio": r, "windows": k, "slower_in": k - faster, "slower_conf": confidence(es[1], es[0])}


def library_kernels(backend: TorchBackend, shape: dict) -> dict[str, list[str]]:
    """The CUDA kernels each library entry launches (torch.profiler), with the addmm-into-out form that
    candidates() leaves out because F.linear makes the same call."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    a, b, bias = backend.inputs(shape)
    out = torch.empty(a.shape[0], b.shape[0], dtype=a.dtype, device=a.device)
    fns = {c.name: c.fn for c in candidates(a, b, bias, a.dtype) if c.libtype == "torch"}
    fns["addmm_into_out (left out)"] = (lambda: torch.mm(a, b.t(), out=out)) if bias is None else (
        lambda: torch.addmm(bias, a, b.t(), out=out))
    got = {}
    for name, fn in fns.items():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        got[name] = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    return got


class Cut(BaseException):
    """The call's time is up (SIGTERM, as `timeout` sends it): the run stops and reports the shapes raced. Not an
    Exception: the race fails a candidate on any Exception and goes on."""


def _cut(signum: int, frame: object) -> None:
    raise Cut()


class NotRaced(RuntimeError):
    """A race of the shape failed (not raced, out of memory): the shape is skipped with the reason."""


def races(backend: TorchBackend, batch: Batch, item: dict, kinds: list[str], i: int, schedules: dict
          ) -> tuple[dict, tuple]:
    """Every race kind on one shape over the same inputs, each going first in turn: ({kind: (result, wall s)},
    the inputs). The exhaustive races take the default schedule."""
    inputs = backend.inputs(item["shape"])
    got = {}
    for kind in kinds[i % len(kinds):] + kinds[:i % len(kinds)]:
        backend.schedule = schedules.get(kind, schedules["halving"])
        t = time.perf_counter()
        race = "exhaustive" if kind.startswith("exhaustive") else "halving"
        res = backend.tune(batch, item, kind=race, inputs=inputs)
        got[kind] = (res, time.perf_counter() - t)
    return got, inputs


def peaks(r: dict) -> list[float]:
    return [m["peak_gib"] for m in (r["ex_memory"], r["hv_memory"]) if m.get("peak_gib") is not None]


def memory(r: dict) -> str:
    """The shape's peak GPU memory in each race against the bound its plan stated before racing."""
    if not peaks(r):
        return ""
    ex, hv = r["ex_memory"], r["hv_memory"]
    return (f" | peak GiB ex {ex['peak_gib']:.2f} (bound {ex['bound_gib']:.2f}) hv {hv['peak_gib']:.2f} "
            f"(bound {hv['bound_gib']:.2f}), room {hv['room_gib']:.1f}")


def judge(ex, other) -> tuple[float, float]:
    """`other`'s pick as `ex` timed it: (pick / ex winner, pick / ex fastest)."""
    us = ok_us(ex)
    by = us.get(other.kernel_name, math.inf)
    return by / us[ex.kernel_name], by / min(us.values())


def ok_us(res) -> dict[str, float]:
    return {c["name"]: c["us"] for c in res.candidates if c["us"] is not None and c["err_ratio"] is not None
            and c["err_ratio"] <= 0.05}


def q(xs: list[float], f: float) -> float:
    """The f-quantile (nearest rank) of xs."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(f * len(xs)))] if xs else math.nan


def tie_inside_spread(r: dict) -> bool:
    """The halving race kept the default in a tie against a faster exhaustive pick, and the referee cannot tell
    the pair apart either (its confidence that the kept default is the slower < 0.95): a tie counts as a right
    pick only when the pair is within the spread (issue 50)."""
    return (r["referee"] > 1.01 and r["hv_decision"] == "tie" and r["hv_winner"] == DEFAULT
            and r["referee_detail"].get("slower_conf", 1.0) < 0.95)


def per_shape(name: str, xs: list[float], sums: float) -> str:
    return (f"{name}: ratio of sums {sums:.3f}; per shape median {q(xs, 0.5):.3f}, p10 {q(xs, 0.1):.3f}, "
            f"p90 {q(xs, 0.9):.3f}, max {max(xs):.3f}")


def top_finalists(res, n: int = 3) -> list[str]:
    """The race's fastest finalists by its own final timings (what an image upgrade carries as `finalists`)."""
    fin = [c for c in res.candidates if c.get("final") and c["us"] is not None and not c["error"]
           and c["err_ratio"] is not None and c["err_ratio"] <= 0.05]
    return [c["name"] for c in sorted(fin, key=lambda c: c["us"])[:n]]


def confirmation(backend: TorchBackend, batch: Batch, item: dict, hv, inputs: tuple, repeats: int) -> dict:
    """Issue 24: the default + incumbent (the halving winner) + the halving race's top 3, against the halving."""
    carried = dict(item, incumbent=hv.kernel_name, finalists=top_finalists(hv))
    t = time.perf_counter()
    cf = backend.tune(batch, carried, inputs=inputs)
    wall = time.perf_counter() - t
    if cf.status == "failed":
        raise NotRaced(f"confirmation: {cf.error}")
    ref = head_to_head(backend, item, inputs, cf.kernel_name, hv.kernel_name, repeats)
    return {"incumbent": carried["incumbent"], "finalists": carried["finalists"], "winner": cf.kernel_name,
            "kind": cf.race["kind"], "raced": [c["name"] for c in cf.candidates],
            "sampled_s": cf.race["sampled_s"], "wall_s": wall, "resampled": cf.race["resampled"],
            "decision": cf.race.get("decision"), "reason": cf.race.get("reason"),
            "h2h": ref["ratio"], "referee": ref}


def slower_in_both(name: str, ex, hv) -> tuple[float, float]:
    """`name`'s time over the fastest finalist's, as the exhaustive and as the halving race timed it."""
    out = []
    for res in (ex, hv):
        us = {c["name"]: c["us"] for c in res.candidates if c.get("final") and c["us"] and not c["error"]}
        out.append(us[name] / min(us.values()) if name in us and us else math.nan)
    return out[0], out[1]


def upgrade(backend: TorchBackend, batch: Batch, items: list[dict], rows: list[dict]) -> dict:
    """Drop the winning Triton configs of every other shape a Triton config won, lease every shape again with
    its incumbent and finalists: the shapes whose incumbent is gone must get a full race, the rest a
    confirmation."""
    triton_wins = [r["hv_winner"] for r in rows if r["hv_winner"].startswith("triton_")]
    dropped = sorted(set(triton_wins[::2]))
    backend.exclude = set(dropped)
    got = []
    try:
        for item, r in zip(items, rows):
            carried = dict(item, incumbent=r["hv_winner"], finalists=r["confirm"]["finalists"])
            try:
                res = backend.tune(batch, carried)
            except GpuBusy as e:
                res = None
                why = f"busy: {e}"
            if res is None or res.race is None:  # busy, or failed before any race: counted as neither kind
                got.append({"M": r["M"], "N": r["N"], "K": r["K"], "lost": r["hv_winner"] in dropped,
                            "kind": "not raced", "winner": None, "sampled_s": 0.0, "raced": 0, "skipped": [],
                            "why": why if res is None else res.error})
                continue
            got.append({"M": r["M"], "N": r["N"], "K": r["K"], "lost": r["hv_winner"] in dropped,
                        "kind": res.race["kind"], "winner": res.kernel_name, "sampled_s": res.race["sampled_s"],
                        "raced": len(res.candidates), "skipped": res.race.get("skipped", []),
                        "why": res.race.get("full_race_why")})
    finally:
        backend.exclude = set()
    lost = [g for g in got if g["lost"]]
    done = [g for g in got if g["kind"] != "not raced"]
    full = [g for g in done if g["kind"] != "confirm"]
    exact = [g["lost"] for g in done] == [g["kind"] != "confirm" for g in done]
    print(f"upgrade: dropped {len(dropped)} Triton configs {dropped}; {len(lost)} shapes lost their kernel; "
          f"re-raced in full {len(full)}, exactly those: {exact}; confirmed {len(done) - len(full)}; not raced "
          f"{len(got) - len(done)}; finalists "
          f"skipped as gone {sum(len(g['skipped']) for g in got)}; a dropped config won anywhere: "
          f"{any(g['winner'] in dropped for g in got)}", flush=True)
    return {"dropped": dropped, "shapes": got, "exact": exact}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--shapes", action="append", help="builtin (the 54 below) or an AITER untuned CSV; repeatable")
    p.add_argument("--limit", type=int, default=0, help="only the first N shapes by size (smoke tests)")
    p.add_argument("--variants", default="", help="comma-separated extra schedules from VARIANTS")
    p.add_argument("--repeat-exhaustive", action="store_true", help="a second exhaustive race per shape")
    p.add_argument("--confirm", action="store_true", help="confirmation races and an upgrade (issue 24)")
    p.add_argument("--kernels", action="store_true", help="print the CUDA kernels each library entry launches")
    p.add_argument("--budget-s", type=float, default=1e9, help="take no new shape after this many seconds")
    p.add_argument("--mem-cap-gib", type=float, help="the race's memory cap (a worker beside a server on the card)")
    p.add_argument("--placement", choices=TorchBackend.PLACEMENTS, default="clone",
                   help="a capture window's fresh input copies: clones, or each shifted to a random offset")
    p.add_argument("--out")
    a = p.parse_args()
    import torch
    ident = detect(int(a.device.split(":")[1]) if a.device.startswith("cuda") else None)
    fam = FAMILIES["bf16_gemm"]
    items = shapes(a.shapes or ["builtin"])
    if a.limit:
        items = sorted(items, key=lambda x: int(x["shape"]["M"]) * int(x["shape"]["N"]) * int(x["shape"]["K"]))
        items = items[:a.limit]
    lease = {"gfx": ident.gfx, "cu_num": ident.cu_num, "tuned_header": list(fam.tuned_header), "shapes": items}
    backend = TorchBackend(device=a.device, repeats=a.repeats, warmup=5, candidate_limit_s=20,
                           mem_cap_bytes=int(a.mem_cap_gib * (1 << 30)) if a.mem_cap_gib else None,
                           placement=a.placement)
    batch = Batch(lease, time.monotonic() + 1e6, lambda: False)
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = "absent"
    print(f"torch {torch.__version__}, triton {tv}, device={a.device} "
          f"{torch.cuda.get_device_name() if a.device.startswith('cuda') else 'cpu'} gfx={ident.gfx}; "
          f"{len(items)} shapes from {a.shapes or ['builtin']}; placement {a.placement}", flush=True)

    build = backend.warm(lease, 1800.0)  # the worker's compile lane: every config once, with and without bias
    compile_s = build["seconds"]
    print(f"compile lane: {compile_s:.1f} s, ok={build['ok']}: {build['output_tail'][:2000]}", flush=True)
    if a.kernels and backend.device.type == "cuda":
        for bias in ("False", "True"):
            s0 = next((x["shape"] for x in items if x["shape"]["bias"] == bias), None)
            for name, ks in (library_kernels(backend, s0).items() if s0 else ()):
                print(f"kernels M={s0['M']} N={s0['N']} K={s0['K']} bias={bias} {name}: {ks}", flush=True)

    rows: list[dict] = []
    raced: list[dict] = []  # the items of rows, in order
    skipped: list[dict] = []  # shapes not raced to the end: busy (the lease would go back), failed, not raced
    default_schedule = backend.schedule
    schedules = {"halving": default_schedule}
    schedules.update({v: Schedule(rounds=VARIANTS[v], final=a.repeats) for v in a.variants.split(",") if v})
    kinds = ["exhaustive", *schedules, *(["exhaustive2"] if a.repeat_exhaustive else [])]
    t_start = time.perf_counter()
    cut = None
    signal.signal(signal.SIGTERM, _cut)
    try:
        for i, item in enumerate(items):
            if time.perf_counter() - t_start > a.budget_s:
                print(f"budget reached: {len(rows)} of {len(items)} shapes raced", flush=True)
                break
            s = item["shape"]
            try:
                got, inputs = races(backend, batch, item, kinds, i, schedules)
                backend.schedule = default_schedule
                bad = {k: res.error for k, (res, _) in got.items() if res.status == "failed"}
                if bad:
                    skipped.append({"M": s["M"], "N": s["N"], "K": s["K"], "failed": bad})
                    print(f"{s['M']:>5} {s['N']:>6} {s['K']:>6} not raced to the end: {bad}", flush=True)
                    continue
                (ex, ex_wall), (hv, hv_wall) = got["exhaustive"], got["halving"]
                ex_us = ok_us(ex)
                best, win_us = min(ex_us.values()), ex_us[ex.kernel_name]
                hv_vs_win, hv_vs_fastest = judge(ex, hv)
                ref = head_to_head(backend, item, inputs, hv.kernel_name, ex.kernel_name, a.repeats)
                referee = ref["ratio"]
                r = {"M": int(s["M"]), "N": int(s["N"]), "K": int(s["K"]), "bias": s["bias"],
                     "candidates": len(ex.candidates), "ex_fastest": ex.race["fastest"], "ex_winner": ex.kernel_name,
                     "ex_us": best, "ex_win_us": win_us, "default_us": ex_us.get(DEFAULT), "hv_winner": hv.kernel_name,
                     "hv_vs_win": hv_vs_win, "hv_vs_fastest": hv_vs_fastest, "hv_us": hv.us,
                     "hv_default_us": hv.default_us,
                     "ex_status": ex.status, "hv_status": hv.status, "hv_resampled": hv.race["resampled"],
                     "ex_sampled_s": ex.race["sampled_s"], "hv_sampled_s": hv.race["sampled_s"],
                     "ex_samples": ex.race["samples"], "hv_samples": hv.race["samples"],
                     "hv_finalists": hv.race["finalists"], "ex_wall_s": ex_wall, "hv_wall_s": hv_wall,
                     "sigma": ex.race["sigma"], "referee": referee, "referee_detail": ref,
                     "hv_decision": hv.race.get("decision"), "hv_confidence": hv.race.get("confidence"),
                     "hv_reason": hv.race.get("reason"), "hv_busy": hv.race.get("busy"), "ex_busy": ex.race.get("busy"),
                     "ex_candidates": ex.candidates,
                     "hv_candidates": hv.candidates, "variants": {},
                     "ex_memory": ex.race["memory"], "hv_memory": hv.race["memory"]}
                for v in schedules:
                    if v != "halving":
                        res, wall = got[v]
                        r["variants"][v] = {"vs_win": judge(ex, res)[0], "vs_fastest": judge(ex, res)[1],
                                            "sampled_s": res.race["sampled_s"], "wall_s": wall,
                                            "same": res.kernel_name == ex.kernel_name}
                if a.repeat_exhaustive:
                    ex2 = got["exhaustive2"][0]
                    us2 = ok_us(ex2)
                    r["ex2_winner"], r["ex2_vs_win"] = ex2.kernel_name, judge(ex, ex2)[0]
                    d1, d2 = ex_us.get(DEFAULT), us2.get(DEFAULT)
                    # how far each contender's time relative to the default moves between the two races
                    r["ratio_moves"] = [abs((ex_us[c] / d1) / (us2[c] / d2) - 1) for c in ex_us
                                        if c in us2 and c != DEFAULT and d1 and d2 and ex_us[c] <= 1.05 * best]
                if a.confirm:
                    r["confirm"] = cf_ = confirmation(backend, batch, item, hv, inputs, a.repeats)
                    # issue 34's rule: never a winner both full races timed >= 3% slower than their fastest finalist
                    cf_["ex_hv_slower"] = slower_in_both(cf_["winner"], ex, hv)
                    cf_["both_3pct_slower"] = all(x >= 1.03 for x in cf_["ex_hv_slower"])
                rows.append(r)
                raced.append(item)
                cf = r.get("confirm")
                print(f"{r['M']:>5} {r['N']:>6} {r['K']:>6} c={r['candidates']:>2} ex={ex.kernel_name:<34} "
                      f"{win_us:9.2f}us "
                      f"hv={hv.kernel_name:<34} x-race {hv_vs_win:6.3f} h2h {referee:6.3f} fin={r['hv_finalists']:>2} "
                      f"gpu {r['hv_sampled_s'] / r['ex_sampled_s']:.3f} wall {hv_wall:5.2f}/{ex_wall:5.2f}s "
                      f"{hv.status}" + (f" ex2={r['ex2_winner']} {r['ex2_vs_win']:.3f}" if a.repeat_exhaustive else "")
                      + (f" | confirm {cf['winner']} h2h {cf['h2h']:.3f} gpu {cf['sampled_s'] / r['hv_sampled_s']:.3f} "
                         f"({len(cf['raced'])} raced)" if cf else "") + memory(r), flush=True)
            except (GpuBusy, NotRaced, torch.OutOfMemoryError) as e:  # what a worker does: the lease goes back
                what = "busy" if isinstance(e, GpuBusy) else "failed"  # (busy) or the shape fails; the run goes on
                skipped.append({"M": s["M"], "N": s["N"], "K": s["K"], what: str(e)[:500]})
                print(f"{s['M']:>5} {s['N']:>6} {s['K']:>6} {what}: {str(e)[:300]}", flush=True)
            finally:
                backend.schedule = default_schedule
    except Cut:  # what raced so far is reported; the shape in flight is not
        cut = f"cut by SIGTERM (the call's timeout) after {len(rows) + len(skipped)} of {len(items)} shapes"
        print(cut, flush=True)
    up = upgrade(backend, batch, raced, rows) if a.confirm and cut is None else None
    summary = report(rows, compile_s, default_schedule, schedules, a, backend, up) if rows else {"shapes": 0}
    summary["skipped"], summary["cut"], summary["placement"] = skipped, cut, a.placement
    print(f"raced to the end {len(rows)} of {len(rows) + len(skipped)} shapes taken; busy (handed back) "
          f"{sum('busy' in x for x in skipped)}, failed or not raced {sum('failed' in x for x in skipped)}; peak GPU "
          f"memory per shape max {max((m for r in rows for m in peaks(r)), default=math.nan):.2f} GiB; the "
          f"process list read {backend.timer.watch.reads} times, {backend.timer.watch.read_s:.1f} s", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"compile_s": compile_s, "summary": summary, "rows": rows,
                                           "upgrade": up, "skipped": skipped}, indent=1))


def report(rows: list[dict], compile_s: float, default_schedule: Schedule, schedules: dict, a, backend, up) -> dict:
    n = len(rows)
    same = sum(r["hv_winner"] == r["ex_winner"] for r in rows)
    same_fastest = sum(r["hv_winner"] == r["ex_fastest"] for r in rows)
    within = sum(r["hv_vs_win"] <= 1.01 for r in rows)
    within_fastest = sum(r["hv_vs_fastest"] <= 1.01 for r in rows)
    h2h = sum(r["referee"] <= 1.01 for r in rows)
    gpu = sum(r["hv_sampled_s"] for r in rows) / sum(r["ex_sampled_s"] for r in rows)
    wall = sum(r["hv_wall_s"] for r in rows) / sum(r["ex_wall_s"] for r in rows)
    gpu_each = [r["hv_sampled_s"] / r["ex_sampled_s"] for r in rows]
    wall_each = [r["hv_wall_s"] / r["ex_wall_s"] for r in rows]
    sp_ex = statistics.geometric_mean([r["default_us"] / r["ex_us"] for r in rows if r["default_us"]])
    sp_hv = statistics.geometric_mean([r["default_us"] / (r["hv_vs_fastest"] * r["ex_us"]) for r in rows
                                       if r["default_us"]])
    rows_ex = sum(r["ex_status"] == "ok" for r in rows)
    rows_hv = sum(r["hv_status"] == "ok" for r in rows)
    cands = [r["candidates"] for r in rows]
    triton_n = [sum(c["name"].startswith("triton_") for c in r["ex_candidates"]) for r in rows]
    worst = max(r["referee"] for r in rows)
    ties = sum(map(tie_inside_spread, rows))
    print()
    print(f"shapes {n}; candidates per shape {min(cands)}..{max(cands)} (Triton configs {min(triton_n)}.."
          f"{max(triton_n)}); compile lane {compile_s:.1f} s")
    print(f"exhaustive: wall {sum(r['ex_wall_s'] for r in rows):.1f} s ({sum(r['ex_wall_s'] for r in rows) / n:.2f} "
          f"s/shape), sampled GPU {sum(r['ex_sampled_s'] for r in rows):.2f} s, samples {sum(r['ex_samples'] for r in rows)}")
    fins = [r["hv_finalists"] for r in rows]
    print(f"halving:    wall {sum(r['hv_wall_s'] for r in rows):.1f} s ({sum(r['hv_wall_s'] for r in rows) / n:.2f} "
          f"s/shape), sampled GPU {sum(r['hv_sampled_s'] for r in rows):.2f} s, samples {sum(r['hv_samples'] for r in rows)}, "
          f"finalists per shape {statistics.mean(fins):.1f} (max {max(fins)}); contested ties re-sampled on "
          f"{sum(r['hv_resampled'] for r in rows)} shapes; eager screen batches timed again because the GPU idled "
          f"(launch gaps) {backend.timer.outran}/{backend.timer.eager_batches}, their {backend.timer.discarded_s:.3f} "
          f"GPU s counted in halving's")
    print(per_shape("sampled GPU halving/exhaustive", gpu_each, gpu))
    print(per_shape("wall halving/exhaustive", wall_each, wall))
    print(f"same winner (after the tie rule) {same}/{n}; halving picked the exhaustive fastest {same_fastest}/{n}")
    print(f"winner vs default ({DEFAULT}) geomean, by the exhaustive timings: exhaustive fastest {sp_ex:.3f}, "
          f"halving winner {sp_hv:.3f}")
    print(f"rows that help (>= 3% over the default): exhaustive {rows_ex}/{n}, halving {rows_hv}/{n}; "
          f"the rest 'default is best'")
    sigmas = [r["sigma"] for r in rows if r["sigma"] is not None]
    print(f"median per-sample sigma (robust) {statistics.median(sigmas):.4f}")
    print(f"cross-race (the halving pick as the exhaustive race timed it): within 1% of the exhaustive winner "
          f"(tie rule applied) {within}/{n}; of the exhaustive fastest (no tie rule) {within_fastest}/{n}")
    if a.repeat_exhaustive:
        moves = sorted(m for r in rows for m in r["ratio_moves"])
        print(f"cross-race ceiling (a second exhaustive race's pick as the first timed it): within 1% "
              f"{sum(r['ex2_vs_win'] <= 1.01 for r in rows)}/{n}; same winner "
              f"{sum(r['ex2_winner'] == r['ex_winner'] for r in rows)}/{n}")
        print(f"between the two exhaustive races, contenders' (within 5% of the fastest) time / default time moved "
              f"by median {q(moves, 0.5):.4f}, p90 {q(moves, 0.9):.4f}, p99 {q(moves, 0.99):.4f} ({len(moves)} pairs)")
    for v in (v for v in schedules if v != "halving"):
        xs = [r["variants"][v] for r in rows]
        print(f"schedule {v} {VARIANTS[v]}: sampled GPU ratio "
              f"{sum(x['sampled_s'] for x in xs) / sum(r['ex_sampled_s'] for r in rows):.3f}; wall ratio "
              f"{sum(x['wall_s'] for x in xs) / sum(r['ex_wall_s'] for r in rows):.3f}; cross-race within 1% "
              f"{sum(x['vs_win'] <= 1.01 for x in xs)}/{n} (of the fastest {sum(x['vs_fastest'] <= 1.01 for x in xs)})"
              f"; same winner {sum(x['same'] for x in xs)}")
    differ = [r for r in rows if r["hv_winner"] != r["ex_winner"]]
    sep = [r for r in differ if r["referee_detail"].get("slower_conf", 0) >= 0.95]
    print(f"head to head (where the picks differ, both re-timed together: {REFEREE_CAPTURES} capture windows, each "
          f"a fresh capture over fresh inputs, guarded, shuffled interleave with the control kernel, scrubbed; the "
          f"ratio is the median window's): halving pick within 1% of the exhaustive pick on {h2h}/{n} shapes "
          f"({len(differ)} differing picks; worst {worst:.3f}; more than 3% slower: "
          f"{sum(r['referee'] > 1.03 for r in rows)}; halving pick slower across the windows (confidence >= 0.95): "
          f"{len(sep)}); a tie that kept the default, the pair within the spread by the referee too: "
          f"{ties} more")
    busy = sum(len(r.get("hv_busy") or []) + len(r.get("ex_busy") or []) for r in rows)
    decisions: dict[str, int] = {}
    for r in rows:
        decisions[str(r.get("hv_decision"))] = decisions.get(str(r.get("hv_decision")), 0) + 1
    print(f"halving decisions {decisions}; busy capture windows re-timed (both races): {busy}")
    print(f"halving schedule {default_schedule}")
    summary = {"shapes": n, "gpu_ratio": gpu, "wall_ratio": wall, "gpu_median": q(gpu_each, 0.5),
               "gpu_p90": q(gpu_each, 0.9), "wall_median": q(wall_each, 0.5), "wall_p90": q(wall_each, 0.9),
               "within_1pct": h2h, "worst_h2h": worst, "finalists_mean": statistics.mean(fins),
               "ties_inside_spread": ties}
    if a.confirm:
        cfs = [r["confirm"] for r in rows]
        cf_gpu = sum(c["sampled_s"] for c in cfs) / sum(r["hv_sampled_s"] for r in rows)
        cf_each = [c["sampled_s"] / r["hv_sampled_s"] for c, r in zip(cfs, rows)]
        cf_wall = [c["wall_s"] / r["hv_wall_s"] for c, r in zip(cfs, rows)]
        cf_within = sum(c["h2h"] <= 1.01 for c in cfs)
        bad = [(r["M"], r["N"], r["K"], c["winner"], c["ex_hv_slower"]) for c, r in zip(cfs, rows)
               if c["both_3pct_slower"]]
        print(f"confirmation handed a shape to a candidate both full races timed >= 3% slower: {len(bad)} {bad}")
        print(f"confirmation race (default + incumbent = the halving winner + the halving top 3; "
              f"{statistics.mean(len(c['raced']) for c in cfs):.1f} raced per shape, all confirm: "
              f"{all(c['kind'] == 'confirm' for c in cfs)}): same winner as the halving race "
              f"{sum(c['winner'] == r['hv_winner'] for c, r in zip(cfs, rows))}/{n}; head to head within 1% of "
              f"the halving winner {cf_within}/{n} (worst {max(c['h2h'] for c in cfs):.3f})")
        print(per_shape("sampled GPU confirmation/halving", cf_each, cf_gpu))
        print(per_shape("wall confirmation/halving", cf_wall, sum(c["wall_s"] for c in cfs) /
                        sum(r["hv_wall_s"] for r in rows)))
        summary.update(confirm_both_3pct_slower=len(bad), confirm_gpu_ratio=cf_gpu, confirm_gpu_median=q(cf_each, 0.5), confirm_within_1pct=cf_within,
                       upgrade_lost=sum(g["lost"] for g in up["shapes"]), upgrade_exact=up["exact"])
        print(f"confirm: sampled GPU ratio {cf_gpu:.3f} (per shape median {q(cf_each, 0.5):.3f}); within 1% "
              f"{cf_within}/{n}; upgrade re-raced exactly the {summary['upgrade_lost']} shapes that lost their "
              f"kernel: {up['exact']}")
    print(f"early-stop: sampled GPU ratio {gpu:.3f}; wall ratio {wall:.3f} (per shape median {q(wall_each, 0.5):.3f},"
          f" p90 {q(wall_each, 0.9):.3f}); within 1% {h2h}/{n} shapes; worst pick {worst:.3f}")
    return summary


if __name__ == "__main__":
    main()
