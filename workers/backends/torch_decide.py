"""The race's bookkeeping and its decision: the halving schedule, one candidate's timings (Entry), one shape's
race (Race), robust noise, and who takes the shape (pure: no device, no timing)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


from app.domain.student_t import t_sf
from workers.backends.torch_candidates import Candidate
from workers.backends.torch_checks import ERR_MAX


def sign_confidence(wins: int, n: int) -> float:
    """One-sided sign test: 1 - P(at least `wins` of n windows faster by chance, p = 1/2)."""
    if n <= 0:
        return 0.0
    return 1.0 - sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n


def t_confidence(logs: list[float]) -> float:
    """One-sided paired t-test over capture windows: the confidence that the mean of the per-window log ratios
    (challenger over kept entry) is below zero. Unlike the sign test it weighs how much faster each window was:
    5 windows 1.5% faster with 1% of capture noise give 0.99 where the sign test stops at 0.969, and one window
    7% off widens the spread more than it moves the mean, so it cannot make a win on its own."""
    n = len(logs)
    if n < 3:
        return 0.0
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    if sd <= 1e-12 * max(1.0, abs(mean)):
        return 1.0 if mean < 0 else 0.0
    return 1 - t_sf(-mean / (sd / math.sqrt(n)), n - 1)


def window_ratios(x: "Entry", p: "Entry") -> list[float]:
    """x's window median over p's, in every capture window both were timed in."""
    xm, pm = x.cap_medians(), p.cap_medians()
    return [xm[w] / pm[w] for w in sorted(xm) if w in pm and pm[w] > 0 and xm[w] > 0]


def versus(x: "Entry", p: "Entry") -> tuple[float, int, int]:
    """x against p over the capture windows both were timed in: (median of x's window median / p's, windows
    x was faster in, windows)."""
    ratios = window_ratios(x, p)
    if not ratios:
        return math.inf, 0, 0
    return statistics.median(ratios), sum(r < 1 for r in ratios), len(ratios)


def confidence(x: "Entry", p: "Entry") -> float:
    """How sure x is faster than p across their capture windows: the larger of the sign test and the paired
    t-test on the log window ratios (each at the same alpha; the gain floor guards the tiny gaps)."""
    ratios = window_ratios(x, p)
    wins = sum(r < 1 for r in ratios)
    return max(sign_confidence(wins, len(ratios)), t_confidence([math.log(r) for r in ratios]))


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
    # a challenger takes a shape from the default (or incumbent) only when it is faster across the capture
    # windows with confidence >= 1 - alpha: the sign test (5 of 5 windows: 0.969) or the paired t-test on the
    # log window ratios (which also weighs by how much), whichever is surer (`confidence`)
    alpha: float = 0.05
    # a tie with a gain over tie_floor in the median window is timed again, the pair alone, up to `retimes`
    # times, each `retime_windows` fresh capture windows of `retime_per_window` samples: capture-to-capture
    # noise, not the samples inside a window, is what hides a 1.5-5% gain (issue 34: at M=256 N=K=4096 the
    # matmul was 2.6% faster in the median of 10 windows, in 7 of them, and F.linear kept the shape)
    retimes: int = 2
    retime_windows: int = 10
    retime_per_window: int = 3
    floor: float = 0.01  # the narrowest band a round keeps (relative)
    # the narrowest band inside which the default (or incumbent) keeps a tie: a gain under 1% is not one a second
    # race reproduces (benchmarks/early_stop.py prints how far kernel/default ratios move between two races)
    tie_floor: float = 0.01
    # the widest per-sample band (a race without capture windows): a gain over 5% (and over tie_floor) is never
    # handed to the default, however noisy the samples (a 10.8% Triton win went to F.linear under a stdev-based
    # band of ~0.1 per sample; issue 28). Capture windows have no such escape: their t-test sees a large
    # consistent gain, and a 5% gain in 3 of 5 windows is capture noise as often as not
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
    checked: bool = False  # its output passed the check and both negative controls (no output is held: memory)

    @property
    def name(self) -> str:
        return self.cand.name

    @property
    def nbytes(self) -> int:
        return self.cand.nbytes

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
    contested: Entry | None = None  # the protected entry a tie kept ahead of a gain over the floor
    challenger: Entry | None = None  # the entry that gain belongs to: the pair a re-time times again
    resampled: bool = False
    retimes: int = 0  # re-times of a contested pair
    discarded_s: float = 0.0  # device time of screen batches timed again (Timer.sample), counted as spent
    decision: str | None = None  # win | tie | lead (the kept entry was itself the fastest) | samples (no windows)
    reason: str | None = None
    confidence: float | None = None  # confidence of the decision over the capture windows (`confidence`)
    windows: int = 0  # capture windows timed
    busy: list[str] = field(default_factory=list)  # busy windows detected (each re-timed)
    noisy: list[str] = field(default_factory=list)  # windows whose control drifted, but not when timed again

    @property
    def samples(self) -> int:
        return sum(len(e.screen) + len(e.samples) + len(e.final) for e in self.entries)

    @property
    def sampled_s(self) -> float:
        return sum(e.sampled_s for e in self.entries) + self.discarded_s

    @property
    def finalists(self) -> int:
        return sum(1 for e in self.entries if e.final)


@dataclass
class Verdict:
    """One challenger against the entry that holds the shape."""

    win: bool
    contested: bool  # not a win, but a gain over the floor that more windows may settle
    confidence: float | None
    said: str
    decision: str  # win | tie | samples (no capture windows: the per-sample band)


def judge(x: Entry, keep: Entry, sch: Schedule, sigma: float) -> Verdict:
    """Does x take the shape from `keep`? With capture windows: its median window ratio is a gain over
    tie_floor AND it is faster across the windows with confidence >= 1 - alpha. Without (samples given
    directly): outside the per-sample noise band, itself between tie_floor and tie_cap."""
    if len(keep.caps) >= 2 and len(x.caps) >= 2:
        r, wins, n = versus(x, keep)
        gain, conf = 1 - r, confidence(x, keep)
        said = f"{x.name} {gain:.2%} faster than {keep.name} in the median of {n} capture windows, faster in {wins}"
        if gain >= sch.tie_floor and conf >= 1 - sch.alpha:
            return Verdict(True, False, conf, f"{said} (confidence {conf:.3f})", "win")
        if gain < sch.tie_floor:
            return Verdict(False, False, conf, f"{said}: under the {sch.tie_floor:.0%} floor, {keep.name} keeps it",
                           "tie")
        return Verdict(False, True, conf, f"{said}: confidence {conf:.3f} < {1 - sch.alpha:.2f}, {keep.name} keeps it",
                       "tie")
    band = max(sch.tie_floor, min(sch.tie_cap, sch.band(sigma, len(keep.final), len(x.final), sch.tie_floor)))
    gain = 1 - x.median / keep.median
    if x.median < keep.median * (1 - band):
        return Verdict(True, False, None, f"{x.name} {gain:.2%} faster, outside the noise band {band:.2%}", "samples")
    return Verdict(False, x.median < keep.median * (1 - sch.tie_floor), None,
                   f"{x.name} {gain:.2%} faster, inside the noise band {band:.2%}", "samples")


def _holder(kept: list[Entry], sch: Schedule, sigma: float) -> tuple[Entry, tuple[Entry, Entry] | None]:
    """Which protected entry holds the shape: the first (the default; a confirmation's incumbent), unless a
    later one takes it by `judge`. Also the first contested pair met."""
    holder, contested = kept[0], None
    for p in kept[1:]:
        v = judge(p, holder, sch, sigma)
        if v.win:
            holder = p
        elif v.contested and contested is None:
            contested = (holder, p)
    return holder, contested


def _lead(race: Race, holder: Entry, ok: list[Entry], why: str) -> Race:
    runner = min((e for e in ok if e is not holder), key=lambda e: e.median, default=None)
    race.winner, race.decision, race.confidence = holder, "lead", None
    race.reason = why
    if runner is not None and len(runner.caps) >= 2 and len(holder.caps) >= 2:
        r, _, n = versus(runner, holder)
        race.confidence = confidence(holder, runner)
        race.reason += f" ({runner.name} {r - 1:+.2%} in the median capture window)"
    return race


def _eligible(e: Entry) -> bool:
    """Timed in the final round and passed the error check."""
    return bool(e.final) and e.error is None and e.err is not None and e.err <= ERR_MAX


def decide(race: Race, protected: list[str], sch: Schedule) -> Race:
    """Who takes the shape. The protected entries (the default then the incumbent; a confirmation race the other
    way) decide who holds it (`_holder`); the fastest challenger that beats the holder (`judge`) takes it,
    else the holder keeps a tie, with the reason. A tie on the first challenger does not end the search: one
    behind it that does beat the holder across the windows takes the shape (a tie must not hand it to an entry
    a challenger beat), and a tie never passes the shape to a later protected entry the holder was not beaten
    by. Where a tie kept a gain over the floor, race.contested/challenger name the pair to time again."""
    ok = [e for e in race.entries if _eligible(e)]
    race.contested = race.challenger = None
    if not ok:
        race.error = "no candidate passed the error check"
        return race
    race.fastest = min(ok, key=lambda e: e.median)
    race.sigma = pooled_sigma(ok, sch.tie_floor)
    by = {e.name: e for e in ok}
    kept = [by[n] for n in dict.fromkeys(protected) if n in by]
    if not kept:
        return _lead(race, race.fastest, ok, "fastest, nothing protected in the race")
    holder, contested = _holder(kept, sch, race.sigma)
    challengers = sorted((e for e in ok if e not in kept and e.median < holder.median), key=lambda e: e.median)
    winner, v, pair = _challenge(holder, challengers, sch, race.sigma)
    if winner is not None and v is not None:
        race.winner, race.decision, race.reason, race.confidence = winner, v.decision, v.said, v.confidence
        return race
    if v is None and holder is race.fastest:
        return _lead(race, holder, ok, f"{holder.name} is the fastest")
    v = v or judge(race.fastest, holder, sch, race.sigma)  # a faster protected entry that tied
    race.winner, race.decision, race.reason, race.confidence = holder, v.decision, v.said, v.confidence
    race.contested, race.challenger = contested or pair or (None, None)
    return race


def _challenge(holder: Entry, challengers: list[Entry], sch: Schedule, sigma: float
               ) -> tuple[Entry | None, Verdict | None, tuple[Entry, Entry] | None]:
    """The first challenger (fastest first) that beats the holder and its verdict, else None and the fastest
    one's verdict; and the first contested pair met before."""
    first: Verdict | None = None
    contested = None
    for c in challengers:
        v = judge(c, holder, sch, sigma)
        if v.win:
            return c, v, contested
        if v.contested and contested is None:
            contested = (holder, c)
        first = first or v
    return None, first, contested
