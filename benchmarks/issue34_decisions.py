"""Issue 34: the race's decision rule replayed on capture windows recorded on the H200 (no device needed).

benchmarks/issue34_windows_h200.json holds, for the 7 shapes of call C (issue34_misses_bf16.csv), every finalist's
capture-window medians as the exhaustive and the halving race recorded them. Each race is decided again by
torch_decide.decide (the rule in this tree) and printed beside what the race decided on the H200 then. A tie the
rule would time again (contested) is shown as such: a replay cannot time new windows.
`--simulate`: how often the win test (gain over the 1% floor in the median window AND confidence >= 0.95) fires
on simulated windows: per-window log ratio = log(1 - gain) + N(0, sd) + a +-7% capture excursion in 10% of
windows (issue 34's cuBLAS path), for the sign test alone (the rule before), the t-test alone, and either.
Run: python benchmarks/issue34_decisions.py [--simulate]
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers.backends.torch_candidates import DEFAULT, Candidate  # noqa: E402
from workers.backends.torch_decide import Entry, Race, Schedule, decide, sign_confidence, t_confidence  # noqa: E402


def entry(name: str, medians_us: list[float]) -> Entry:
    e = Entry(Candidate(name, "torch", 0, lambda: None))
    for w, us in enumerate(medians_us, 1):
        e.caps.append((w, [us * 1e-6]))
        e.final.append(us * 1e-6)
    e.err = 0.0
    return e


def simulate(trials: int = 4000, seed: int = 1) -> None:
    rng = random.Random(seed)
    print("true gain, window sd, windows: share declared a win (sign test alone / t-test alone / either)")
    for sd in (0.01, 0.02, 0.04):
        for gain in (0.0, -0.03, 0.015, 0.03, 0.05):
            cells = []
            for n in (5, 15, 25):
                won = [0, 0, 0]
                for _ in range(trials):
                    logs = [math.log(1 - gain) + rng.gauss(0, sd) +
                            (rng.choice((-1, 1)) * 0.07 if rng.random() < 0.1 else 0.0) for _ in range(n)]
                    over = 1 - math.exp(sorted(logs)[n // 2]) >= 0.01
                    sc, tc = sign_confidence(sum(x < 0 for x in logs), n), t_confidence(logs)
                    for i, c in enumerate((sc, tc, max(sc, tc))):
                        won[i] += over and c >= 0.95
                cells.append(f"n={n}: " + " / ".join(f"{w / trials:.3f}" for w in won))
            print(f"gain {gain:+.3f} sd {sd:.2f}  " + "   ".join(cells))


def main() -> None:
    if "--simulate" in sys.argv:
        simulate()
        return
    data = json.loads((Path(__file__).parent / "issue34_windows_h200.json").read_text())
    print(data["source"])
    for s in data["shapes"]:
        rec = s["recorded"]
        for kind in ("exhaustive", "halving"):
            race = decide(Race([entry(n, ms) for n, ms in s[kind].items()], kind), [DEFAULT], Schedule())
            then = rec["ex_winner"] if kind == "exhaustive" else rec["hv_winner"]
            again = " (contested: timed again)" if race.contested is not None else ""
            print(f"{s['M']:>5} {s['N']:>6} {s['K']:>6} {kind:<10} then {then:<20} now {race.winner.name:<20} "
                  f"{race.decision}{again}: {race.reason}")
        print(f"{'':>19} confirmation then {rec['confirm_winner']} ({rec['confirm_reason']}); the referee timed "
              f"it at {rec['confirm_referee']:.3f} x the halving pick")


if __name__ == "__main__":
    main()
