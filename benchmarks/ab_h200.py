"""The serving A/B on a GPU (issue 32): do the torch backend's kernel wins survive to serving?

One script, one device call: (1) race the torch backend (workers/backends/torch_race.py, halving race as a worker
runs it, the compile lane first) on the decode GEMMs of a small Llama-shaped decoder (hidden 4096, intermediate
14336, 32 heads / 8 KV heads: N x K = 6144x4096 QKV, 4096x4096 O, 28672x4096 gate/up, 4096x14336 down) at the M
buckets the bands' batch sizes hit (AITER's tries: raw M, getPaddedM gl0, gl1), and write its winning rows as an
overlay in the bf16 tuned header; (2) per run, start three servers of benchmarks/ab_decoder_server.py (random bf16
weights, CUDA graphs per batch size): A and A' (no overlay: F.linear everywhere) and B (AITER_CONFIG_GEMM_BF16 = the
overlay), and drive each band in rounds in app.domain.ab_stats.round_order (a Williams design) with
app.ab_load.drive_band; (3) per band, app.domain.ab_stats.analyse_band: effect of B on output tok/s (and TTFT/ITL
p50/p99) with its interval and MDE, and the A' control. Two runs, each on fresh server processes.

    PYTHONUNBUFFERED=1 python3 benchmarks/ab_h200.py --device cuda:0 --out $OUT/ab_h200.json

CPU smoke test (tiny decoder, no Triton): python benchmarks/ab_h200.py --device cpu --tiny --runs 1 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.ab_load import drive_band, greedy_answers  # noqa: E402
from app.ab_wire import OperatingPoint, RequestRecord  # noqa: E402
from app.domain.ab_stats import GateParams, analyse_band, round_order, run_verdict  # noqa: E402
from app.domain.families import FAMILIES  # noqa: E402
from app.domain.log_lines import parse_log  # noqa: E402

FAM = FAMILIES["bf16_gemm"]
SERVER = ROOT / "benchmarks" / "ab_decoder_server.py"


def say(*a: object) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def race(dims: dict[str, int], ms: list[int], device: str, out_csv: Path) -> tuple[str, int, list[dict]]:
    import torch

    from app.domain.shapes import make_shape
    from workers.backends.base import Batch
    from workers.backends.torch_race import TorchBackend
    from workers.identity import detect
    ident = detect(int(device.split(":")[1]) if device.startswith("cuda") else None)
    h, i, kv = dims["hidden"], dims["inter"], 2 * dims["kv_heads"] * (dims["hidden"] // dims["heads"])
    nk = [(h + kv, h), (h, h), (2 * i, h), (h, i)]
    items = [{"shape_id": j, "shape": make_shape(FAM, {"M": m, "N": n, "K": k}).as_dict()}
             for j, (m, (n, k)) in enumerate((m, x) for x in nk for m in ms)]
    lease = {"gfx": ident.gfx, "cu_num": ident.cu_num, "tuned_header": list(FAM.tuned_header), "shapes": items}
    be = TorchBackend(device=device)
    t0 = time.monotonic()
    if be.builds:
        rep = be.warm(lease, budget_s=240)
        say(f"compile lane: {rep['seconds']:.1f}s ok={rep['ok']}")
    res: list = []
    be.run(Batch(lease, time.monotonic() + 1e6, lambda: False), res.append)
    say(f"race: {len(res)} shapes in {time.monotonic() - t0:.1f}s on {ident.gfx} cu_num={ident.cu_num} "
        f"({torch.cuda.get_device_name() if device.startswith('cuda') else 'cpu'})")
    rows, table = [], []
    for r in res:
        s = next(x["shape"] for x in items if x["shape_id"] == r.shape_id)
        sp = r.default_us / r.us if r.us and r.default_us else None
        table.append({"M": s["M"], "N": s["N"], "K": s["K"], "status": r.status, "winner": r.kernel_name,
                      "us": r.us, "default_us": r.default_us, "speedup": sp})
        say(f"  M={s['M']:>3} N={s['N']:>5} K={s['K']:>5} default {r.default_us or 0:8.2f} us  best {r.us or 0:8.2f} us"
            f"  x{sp or 0:.3f}  {r.kernel_name} ({r.status})")
        if r.row:
            rows.append(r.row)
    with open(out_csv, "w", newline="") as fh:
        wr = csv.DictWriter(fh, fieldnames=list(FAM.tuned_header))
        wr.writeheader()
        wr.writerows(rows)
    say(f"overlay: {len(rows)} rows -> {out_csv}")
    return ident.gfx, ident.cu_num, table


class Server:
    def __init__(self, arm: str, port: int, work: Path, overlay: Path | None, extra: list[str]):
        self.arm, self.url = arm, f"http://127.0.0.1:{port}"
        self.log = work / f"{arm}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AITER_CONFIG_")}
        if overlay is not None:
            env["AITER_CONFIG_GEMM_BF16"] = str(overlay)
        self.err = open(work / f"{arm}.err", "w")
        self.proc = subprocess.Popen([sys.executable, str(SERVER), "--port", str(port), "--log-file", str(self.log),
                                      *extra], env=env, stdout=self.err, stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"arm {self.arm}'s server exited: {(self.log.parent / (self.arm + '.err')).read_text()[-3000:]}")
        return self.log.exists() and "ready on port" in self.log.read_text()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def one_run(run: int, a: argparse.Namespace, overlay: Path, work: Path, extra: list[str]) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    arms = {"A": None, "A_prime": None, "B": overlay}
    servers = {arm: Server(arm, a.port + 10 * run + j, work, ov, extra) for j, (arm, ov) in enumerate(arms.items())}
    t_start = time.monotonic()
    try:
        while not all(s.ready() for s in servers.values()):
            await asyncio.sleep(0.5)
        say(f"run {run}: servers up in {time.monotonic() - t_start:.1f}s: "
            + "; ".join(s.log.read_text().splitlines()[0] for s in servers.values()))
        points = [OperatingPoint(concurrency=c, input_len=a.input_len, output_len=a.output_len) for c in a.bands]
        t0 = time.monotonic()
        for s in servers.values():  # warm-up: every band once, not measured
            for p in points:
                await drive_band(s.url, "ab-decoder", p, arm=s.arm, repeat=0, n_requests=p.concurrency, seed=99,
                                 started_at=t0)
        prompts = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 5, 8, 13,", "good morning"]
        greedy = {arm: [x.tokens for x in await greedy_answers(s.url, "ab-decoder", prompts, 8)]
                  for arm, s in servers.items()}
        passes: dict[str, dict[tuple[int, str], list[RequestRecord]]] = {p.name: {} for p in points}
        for p in points:
            for rep in range(a.rounds):
                for arm in round_order(rep):
                    passes[p.name][(rep, arm)] = await drive_band(
                        servers[arm].url, "ab-decoder", p, arm=arm, repeat=rep,  # type: ignore[arg-type]
                        n_requests=max(a.min_requests, a.requests_per_conc * p.concurrency), seed=1000 * rep + run,
                        started_at=t0)
        gp = GateParams()
        bands = [analyse_band(p.name, passes[p.name], a.rounds, len(points), gp) for p in points]
        hits = [e for e in parse_log(Path(f"{servers['B'].log}.rank0").read_text()).events if e.hit]
        a_hits = [e for arm in ("A", "A_prime") for e in parse_log(Path(f"{servers[arm].log}.rank0").read_text()
                                                                    if Path(f"{servers[arm].log}.rank0").exists()
                                                                    else "").events if e.hit]
        verdict = run_verdict(bands)
        out = {"run": run, "verdict": verdict.as_dict(), "measure_s": time.monotonic() - t0,
               "b_hit_lines": len(hits), "b_hit_shapes": sorted({(e.shape["M"], e.padded_m, e.shape["N"],
                                                                   e.shape["K"], e.kernel) for e in hits}),
               "a_hit_lines": len(a_hits),
               "greedy_equal": {arm: greedy[arm] == greedy["A"] for arm in greedy},
               "greedy_token_agreement": {arm: sum(x == y for ga, gb in zip(greedy["A"], greedy[arm])
                                                   for x, y in zip(ga, gb)) / max(1, sum(map(len, greedy["A"])))
                                          for arm in greedy}}
        for b in bands:
            e, c = b.effect.get("output_tok_s", {}), b.control.get("output_tok_s", {})

            def pct(d: dict) -> str:
                if d.get("effect") is None:
                    return "n/a"
                return f"{100 * d['effect']:+.2f}% [{100 * d['lo']:+.2f}, {100 * d['hi']:+.2f}] MDE {100 * d['mde']:.2f}%"
            say(f"run {run} {b.band}: {b.verdict.value}{' (' + b.reason + ')' if b.reason else ''}; B vs A tok/s "
                f"{pct(e)}; control A' vs A {pct(c)}; ITL p50 B vs A {pct(b.effect.get('itl_p50', {}))}; "
                f"TTFT p50 {pct(b.effect.get('ttft_p50', {}))}; requests {b.requests}")
        say(f"run {run}: verdict {verdict.verdict.value} {verdict.reason or ''}; B hit lines {len(hits)} "
            f"(A/A' {len(a_hits)}); greedy equal to A: {out['greedy_equal']} agreement "
            f"{out['greedy_token_agreement']}; measured in {out['measure_s']:.1f}s")
        return out
    finally:
        for s in servers.values():
            s.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--tiny", action="store_true", help="a CPU smoke test's decoder (hidden 256)")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--bands", type=int, nargs="+", default=[2, 8, 32])
    p.add_argument("--ms", type=int, nargs="+", default=[1, 2, 8, 16, 32])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--requests-per-conc", type=int, default=3)
    p.add_argument("--min-requests", type=int, default=16)
    p.add_argument("--port", type=int, default=18900)
    p.add_argument("--work", default="/tmp/ab_h200")
    p.add_argument("--overlay", help="use this overlay, no race")
    p.add_argument("--out")
    a = p.parse_args()
    dims = (dict(hidden=256, inter=512, heads=4, kv_heads=2, vocab=1000) if a.tiny else
            dict(hidden=4096, inter=14336, heads=32, kv_heads=8, vocab=32000))
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if a.overlay:
        overlay, table = Path(a.overlay), []
        gfx, cu = "", 0
        with open(overlay) as fh:
            r0 = next(csv.DictReader(fh), None)
            if r0:
                gfx, cu = r0["gfx"], int(r0["cu_num"])
    else:
        overlay = work / "overlay_bf16.csv"
        gfx, cu, table = race(dims, a.ms, a.device, overlay)
    extra = ["--device", a.device, "--layers", str(a.layers), "--gfx", gfx, "--cu-num", str(cu),
             "--max-batch", str(max(a.bands) + 8), "--max-ctx", str(a.input_len + a.output_len + 8),
             *[x for k, v in dims.items() for x in (f"--{k.replace('_', '-')}", str(v))]]
    if a.device == "cpu":
        extra.append("--no-graphs")
    runs: list[dict] = []
    for r in range(1, a.runs + 1):
        runs.append(asyncio.run(one_run(r, a, overlay, work / f"run{r}", extra)))
        if a.out:  # after every run: a run cut short by the device's time limit keeps the ones before it
            Path(a.out).write_text(json.dumps({"args": vars(a), "race": table, "overlay": overlay.read_text(),
                                               "runs": runs}, indent=1, default=str))
    say(f"total {time.monotonic() - t0:.1f}s")


if __name__ == "__main__":
    main()
