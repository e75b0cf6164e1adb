"""A campaign's queue order before and after served-share weights (app/domain/served.py), through the service.

Shapes: AITER's shipped bf16 shape list for one model (model_configs/minimax_m3_eagle_bf16_untuned_gemm.csv),
captured from log lines, so every shape has 1 call (AITER logs a lookup once per shape per process).
Histogram: vllm:iteration_tokens_total of a SIMULATED vLLM engine (continuous batching, chunked prefill; the
parameters are printed), not a measurement: no model can be served on this machine.

Prints the top of the queue under each rule and how much of the served time (steps x default time, the same
estimate both rules use) the first k shapes of each order cover.

    .venv/bin/python benchmarks/served_share.py [--steps 20000] [--top 12]
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TABLE = ROOT / "tests/fixtures/aiter/configs/model_configs/minimax_m3_eagle_bf16_untuned_gemm.csv"
BOUNDS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
DIGEST = "sha256:" + "5e" * 32


def simulate(steps: int, seed: int, max_seqs: int, max_batched: int, arrivals: float) -> dict[str, int]:
    """Tokens per engine step of a continuous-batching engine with chunked prefill: every running sequence
    decodes one token a step; the rest of the step's token budget goes to waiting prompts, in chunks."""
    rng = random.Random(seed)
    waiting: list[int] = []  # prompt tokens left to prefill
    running: list[int] = []  # output tokens left
    hist = dict.fromkeys([str(b) for b in BOUNDS] + ["+Inf"], 0)
    for _ in range(steps):
        # Poisson arrivals; prompt and output lengths lognormal (medians 800 and 300 tokens)
        k, p = 0, math.exp(-arrivals)
        u = rng.random()
        while u > p:
            k += 1
            u *= rng.random()
        waiting += [min(16384, int(rng.lognormvariate(math.log(800), 1.0))) + 1 for _ in range(k)]
        tokens = len(running)
        budget = max_batched - tokens
        while waiting and budget > 0 and len(running) + 1 <= max_seqs:
            take = min(waiting[0], budget)
            waiting[0] -= take
            tokens += take
            budget -= take
            if waiting[0] == 0:
                waiting.pop(0)
                running.append(int(rng.lognormvariate(math.log(300), 0.8)) + 1)
        running = [r - 1 for r in running if r > 1]
        if tokens:
            key = next((str(b) for b in BOUNDS if tokens <= b), "+Inf")
            hist[key] += 1
    return hist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-seqs", type=int, default=128)
    ap.add_argument("--max-batched", type=int, default=8192)
    ap.add_argument("--arrivals", type=float, default=0.05, help="requests per step (Poisson mean)")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()

    from fastapi.testclient import TestClient

    from app.config import Settings
    from app.main import create_app

    hist = simulate(args.steps, args.seed, args.max_seqs, args.max_batched, args.arrivals)
    total = sum(hist.values())
    print(f"simulated engine: {args.steps} steps, max_num_seqs={args.max_seqs}, "
          f"max_num_batched_tokens={args.max_batched}, {args.arrivals} requests/step, seed {args.seed}")
    print("tokens-per-step histogram (share of steps):",
          ", ".join(f"<={k}: {100 * v / total:.1f}%" for k, v in hist.items() if v))
    with open(TABLE) as f:
        shapes = [{c: r[c] for c in ("M", "N", "K", "bias", "dtype", "outdtype", "scaleAB", "bpreshuffle")}
                  for r in csv.DictReader(f)]
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(database_url=f"sqlite:///{tmp}/t.db", auth=False)
        with TestClient(create_app(settings)) as c:
            body = {"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304, "family": "bf16_gemm", "host": "bench"}
            cid = c.post("/v1/captures", json=dict(body, shapes=shapes)).json()["campaign_id"]
            before = c.get(f"/v1/campaigns/{cid}").json()
            c.post("/v1/captures", json=dict(body, shapes=[], step_buckets=hist)).raise_for_status()
            after = c.get(f"/v1/campaigns/{cid}").json()
    truth = {key(s): s["served"] for s in after["shape_list"]}  # steps x default time
    print(f"{len(shapes)} shapes from {TABLE.name}, 1 call each (one log line per shape per process)\n")
    print(f"{'rank':>4}  {'before: ' + before['priority_rule']:<44} {'after: ' + after['priority_rule']:<44}")
    for i in range(args.top):
        b, a = before["shape_list"][i], after["shape_list"][i]
        print(f"{i + 1:>4}  {label(b):<44} {label(a):<44}")
    whole = sum(truth.values())
    print("\nshare of served time covered by the first k shapes tuned:")
    for k in (5, 10, 20, 40):
        cb = sum(truth[key(s)] for s in before["shape_list"][:k]) / whole
        ca = sum(truth[key(s)] for s in after["shape_list"][:k]) / whole
        print(f"  k={k:>3}: before {100 * cb:5.1f}%   after {100 * ca:5.1f}%")


def key(s: dict) -> tuple:
    return tuple(sorted(s["shape"].items()))


def label(s: dict) -> str:
    sh = s["shape"]
    return f"M={sh['M']:>5} N={sh['N']:>5} K={sh['K']:>5} bias={sh['bias'][0]}"


if __name__ == "__main__":
    main()
