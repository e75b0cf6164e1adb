"""The race's bookkeeping and its decision: the halving schedule, one candidate's timings (Entry), one shape's
race (Race), robust noise, and who takes the shape (pure: no device, no timing)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from workers.backends.torch_candidates import Candidate
from workers.backends.torch_checks import ERR_MAX


def sign_confidence(wins: int, n: int) -> float:
    """One-sided sign test: 1 - P(at least `wins` of n windows faster by chance, p = 1/2)."""
    if n <= 0:
        return 0.0
    return 1.0 - sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n


def versus(x: "Entry", p: "Entry") -> tuple[float, int, int]:
    """x against p over the capture windows both were timed in: (median of x's window median / p's, windows
    x was faster in, windows)."""
    xm, pm = x.cap_medians(), p.cap_medians()
    ratios = [xm[w] / pm[w] for w in xm if w in pm and pm[w] > 0]
    if not ratios:
        return math.inf, 0, 0
    return statistics.median(ratios), sum(r < 1 for r in ratios), len(ratios)



@dataclass(frozen=True)
class Schedule:
    """Successive halving. Each round gives every survivor `samples` more timed samples, then keeps the best
    `keep` fraction and every candidate inside the leader's noise band, `cap` at most (the fastest first): its
    median no more than max(floor, z * 1.25 * sigma * sqrt(1/n + 1/n_leader)) above the leader's (1.25 sigma /
    sqrt(n) is the standard error of a median; sigma is the pooled robust per-sample relative spread). Before the
    cap the band alone decided survival: a noisy screen kept 25-29 of 59 (issue 28). The default and the
    incumbent always go on, outside the cap (they get `protect_samples` in the screen so sigma is known from
    the start). Finalists get `final` fresh samples, interleaved; a confirmation race `confirm` samples each."""

    rounds: tuple[tuple[int, float, int], ...] = ((1, 0.15, 10), (3, 0.25, 3))  # (samples, keep, cap)
    final: int = 30
    # the final round (and a confirmation race) times each finalist in `captures` independent CUDA-graph
    # captures over fresh copies of the inputs, all finalists of one capture window interleaved (issue 34: one
    # cuBLAS path moved up to 7% from one capture to the next; a 2-capture referee was as noisy as the 1% gaps)
    captures: int = 5
    confirm: int = 10
    # a challenger takes a shape from the default (or incumbent) only when it is faster in enough capture
    # windows that a one-sided sign test gives confidence >= 1 - alpha (5 of 5 windows: 0.969; 9 of 10: 0.989)
    alpha: float = 0.05
    floor: float = 0.01  # the narrowest band a round keeps (relative)
    # the narrowest band inside which the default (or incumbent) keeps a tie: a gain under 1% is not one a second
    # race reproduces (benchmarks/early_stop.py prints how far kernel/default ratios move between two races)
    tie_floor: float = 0.01
    # the widest statistical band: a gain over 5% (and over tie_floor) is never handed to the default, however
    # noisy the samples (a 10.8% Triton win went to F.linear under a stdev-based band of ~0.1 per sample; issue 28)
    tie_cap: float = 0.05
    z: float = 3.0
    protect_samples: int = 3
    eager_screen: bool = True  # round 1 on eager calls: a graph is captured only for its survivors

    def per_window(self, n: int) -> int:
        """Samples of each entry in one capture window of a round of n: at least 3 (a window's median)."""
        return max(3, math.ceil(n / self.captures))

    def band(self, sigma: float, n: int, n_lead: int, floor: float) -> float:
        return max(floor, self.z * 1.25 * sigma * math.sqrt(1 / max(1, n) + 1 / max(1, n_lead)))


@dataclass
class Entry:
    """One candidate's state in one shape's race."""

    cand: Candidate
    replay: tuple[Callable[[], Any], int] | None = None  # what one sample runs, and how many calls it holds
    graphed: bool = False  # replay is a captured graph (else eager calls)
    screen: list[float] = field(default_factory=list)  # seconds per call, the eager screen
    samples: list[float] = field(default_factory=list)  # seconds per call, the graph rounds before the final
    final: list[float] = field(default_factory=list)  # seconds per call, the final round
    caps: list[tuple[int, list[float]]] = field(default_factory=list)  # (capture window, its samples)
    sampled_s: float = 0.0  # device time spent in this candidate's timed samples
    rounds: int = 0  # rounds survived
    err: float | None = None
    error: str | None = None
    out: torch.Tensor | None = None

    @property
    def name(self) -> str:
        return self.cand.name

    @property
    def times(self) -> list[float]:
        return self.final or self.samples or self.screen

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else math.inf

    def cap_medians(self) -> dict[int, float]:
        return {w: statistics.median(ts) for w, ts in self.caps if ts}

    def stats(self) -> dict[str, float | None]:
        """worst and p90 sample (us), drift (last capture window's median over the first's, minus 1) and spread
        (slowest capture median over the fastest, minus 1) of the final round."""
        if not self.final:
            return {"worst_us": None, "p90_us": None, "drift": None, "spread": None}
        xs = sorted(self.final)
        meds = [m for _, m in sorted(self.cap_medians().items())]
        return {"worst_us": xs[-1] * 1e6, "p90_us": xs[min(len(xs) - 1, int(0.9 * len(xs)))] * 1e6,
                "drift": meds[-1] / meds[0] - 1 if len(meds) > 1 else None,
                "spread": max(meds) / min(meds) - 1 if len(meds) > 1 else None}

    def record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {"name": self.name, "us": self.median * 1e6 if self.times else None,
                               "err_ratio": self.err, "error": self.error, "rounds": self.rounds,
                               "final": bool(self.final), "samples": len(self.screen) + len(self.samples) +
                               len(self.final), **self.stats(),
                               "captures": [m * 1e6 for _, m in sorted(self.cap_medians().items())]}
        return rec


def rel_spread(xs: list[float]) -> float:
    """Robust per-sample relative spread: 1.4826 * MAD / median (the stdev for normal noise; a few outliers,
    a clock dip or a preempted sample, move it little where they move the stdev a lot)."""
    med = statistics.median(xs)
    return 1.4826 * statistics.median(abs(x - med) for x in xs) / med if med > 0 else 0.0


def pooled_sigma(entries: list[Entry], default: float) -> float:
    """Median robust per-sample relative spread over candidates with >= 3 samples."""
    rel = [rel_spread(e.times) for e in entries if len(e.times) >= 3]
    return statistics.median(rel) if rel else default


@dataclass
class Race:
    """What one shape's race did: every entry, the winner, and what it cost."""

    entries: list[Entry]
    kind: str
    winner: Entry | None = None
    fastest: Entry | None = None  # before the tie rule
    sigma: float | None = None
    error: str | None = None
    contested: Entry | None = None  # the protected entry the band alone kept ahead of a gain over the floor
    resampled: bool = False
    discarded_s: float = 0.0  # device time of screen batches timed again (Timer.sample), counted as spent
    decision: str | None = None  # win | tie | lead (the kept entry was itself the fastest) | samples (no windows)
    reason: str | None = None
    confidence: float | None = None  # sign-test confidence of the decision over the capture windows
    windows: int = 0  # capture windows timed
    busy: list[str] = field(default_factory=list)  # busy windows detected (each re-timed)

    @property
    def samples(self) -> int:
        return sum(len(e.screen) + len(e.samples) + len(e.final) for e in self.entries)

    @property
    def sampled_s(self) -> float:
        return sum(e.sampled_s for e in self.entries) + self.discarded_s

    @property
    def finalists(self) -> int:
        return sum(1 for e in self.entries if e.final)
