"""The serving A/B's statistics (issue 32): pure functions over the per-request records of a run's passes.

A run measures each band in rounds; a round runs every arm once, in an order that reverses from one round to the
next (A B A' then A' B A: ABBA blocks), so a linear drift of the node adds +d to one round's B/A ratio and -d to
the next one's, and cancels in their mean. Per band and metric, each round gives one paired log-ratio (B against
the A of the same round, and the control A' against that A); the effect is the geometric mean ratio with a
Student-t interval over rounds. The drift left in single rounds widens the interval (conservative), it does not
bias it. With k bands in a run every interval is made at confidence 1 - alpha/k (Bonferroni), so the run's chance
of a false verdict, and of a false control alarm, stays at alpha whatever the number of bands.

Stdlib only (the service has no numpy/scipy): the t quantile comes from the regularized incomplete beta function
(continued fraction, Numerical Recipes 6.4) inverted by bisection.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from enum import StrEnum
from typing import Any

from app.ab_wire import RequestRecord


class Verdict(StrEnum):
    GAIN = "gain"
    NEUTRAL = "neutral"
    REGRESSION = "regression"
    VOID = "void"


# metric -> True when higher is better. The verdict is made on the first (throughput); the latency percentiles are
# reported with their intervals beside it.
METRICS: dict[str, bool] = {"output_tok_s": True, "ttft_p50": False, "ttft_p99": False, "itl_p50": False,
                            "itl_p99": False}
PRIMARY = "output_tok_s"


def round_order(repeat: int) -> tuple[str, ...]:
    """The arms' order in a round: reversed every other round (ABBA), so linear drift cancels over two rounds."""
    return ("A", "B", "A_prime") if repeat % 2 == 0 else ("A_prime", "B", "A")


# ---- Student t, stdlib only -------------------------------------------------------------------------------------

def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t >= 0 else tail


@lru_cache(maxsize=4096)  # pure; a run asks the same few (p, df) for every band and metric
def t_ppf(p: float, df: float) -> float:
    """The t quantile: t_cdf(t_ppf(p, df), df) == p (bisection, to 1e-12)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    lo, hi = -1e4, 1e4
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2.0


# ---- per pass ---------------------------------------------------------------------------------------------------

def percentile(xs: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class PassStats:
    requests: int
    completed: int  # no error, at least one token
    errors: int
    first_error: str | None
    metrics: dict[str, float | None]


def pass_stats(records: Iterable[RequestRecord]) -> PassStats:
    recs = list(records)
    ok = [r for r in recs if r.error is None and r.output_tokens > 0 and r.latency_s is not None]
    errs = [r for r in recs if r.error is not None]
    m: dict[str, float | None] = dict.fromkeys(METRICS)
    if ok:
        t0 = min(r.started_s for r in ok)
        t1 = max(r.started_s + (r.latency_s or 0.0) for r in ok)
        m["output_tok_s"] = sum(r.output_tokens for r in ok) / (t1 - t0) if t1 > t0 else None
        ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
        itl = [x for r in ok for x in r.itl_s]
        m["ttft_p50"], m["ttft_p99"] = percentile(ttft, 0.5), percentile(ttft, 0.99)
        m["itl_p50"], m["itl_p99"] = percentile(itl, 0.5), percentile(itl, 0.99)
    return PassStats(len(recs), len(ok), len(errs), errs[0].error if errs else None, m)


# ---- per band ---------------------------------------------------------------------------------------------------

@dataclass
class Interval:
    """B against A (or A' against A) on one metric: effect = geometric-mean ratio - 1, its interval, and the
    smallest effect the run would detect with the given power (both as fractions: 0.05 is 5%)."""
    n: int
    effect: float | None = None
    lo: float | None = None
    hi: float | None = None
    mde: float | None = None

    def excludes_zero(self) -> bool:
        return self.lo is not None and self.hi is not None and (self.lo > 0 or self.hi < 0)


def interval(log_ratios: Sequence[float], alpha: float, power: float) -> Interval:
    n = len(log_ratios)
    if n < 2:
        return Interval(n)
    mean = sum(log_ratios) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in log_ratios) / (n - 1))
    se = sd / math.sqrt(n)
    tq = t_ppf(1 - alpha / 2, n - 1)
    mde = (tq + t_ppf(power, n - 1)) * se
    return Interval(n, math.expm1(mean), math.expm1(mean - tq * se), math.expm1(mean + tq * se), math.expm1(mde))


@dataclass
class BandResult:
    band: str
    verdict: Verdict
    reason: str | None
    rounds: int
    effect: dict[str, dict[str, Any]] = field(default_factory=dict)  # metric -> Interval of B vs A
    control: dict[str, dict[str, Any]] = field(default_factory=dict)  # metric -> Interval of A' vs A
    control_flags: bool = False  # the identical-arm control shows an effect on the primary metric
    requests: dict[str, int] = field(default_factory=dict)  # arm -> completed requests over the band

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdict"] = self.verdict.value
        return d


@dataclass(frozen=True)
class GateParams:
    confidence: float = 0.95  # the run's: every verdict and the control at once (Bonferroni over bands)
    power: float = 0.8  # for the minimum detectable effect
    min_requests: int = 4  # completed requests an arm needs in every pass of a band
    max_error_frac: float = 0.1  # more failed requests than this in a pass voids the band
    min_rounds: int = 2


def _signed_log_ratio(b: float | None, a: float | None) -> float | None:
    if b is None or a is None or b <= 0 or a <= 0:
        return None
    return math.log(b / a)


def analyse_band(band: str, passes: dict[tuple[int, str], list[RequestRecord]], rounds: int, n_bands: int,
                 p: GateParams) -> BandResult:
    """passes: (repeat, arm) -> that pass's records, for repeats 0..rounds-1 and every arm."""
    alpha = (1 - p.confidence) / max(1, n_bands)
    stats: dict[tuple[int, str], PassStats] = {}
    completed: dict[str, int] = {"A": 0, "A_prime": 0, "B": 0}
    for r in range(rounds):
        for arm in ("A", "A_prime", "B"):
            recs = passes.get((r, arm))
            if recs is None:
                return BandResult(band, Verdict.VOID, f"pass {r} of arm {arm} was not measured", rounds)
            st = stats[(r, arm)] = pass_stats(recs)
            completed[arm] += st.completed
            if st.completed < p.min_requests:
                return BandResult(band, Verdict.VOID, f"too few requests: arm {arm} pass {r} completed "
                                  f"{st.completed} of {st.requests} (at least {p.min_requests} needed)"
                                  + (f"; first error: {st.first_error}" if st.first_error else ""), rounds,
                                  requests=completed)
            if st.errors > p.max_error_frac * st.requests:
                return BandResult(band, Verdict.VOID, f"arm {arm} pass {r}: {st.errors} of {st.requests} requests "
                                  f"failed (more than {p.max_error_frac:.0%}); first error: {st.first_error}",
                                  rounds, requests=completed)
    if rounds < p.min_rounds:
        return BandResult(band, Verdict.VOID, f"{rounds} round(s); at least {p.min_rounds} are needed for an "
                          "interval", rounds, requests=completed)
    effect, control = {}, {}
    for metric, higher_better in METRICS.items():
        lb, lc = [], []
        for r in range(rounds):
            a = stats[(r, "A")].metrics[metric]
            x = _signed_log_ratio(stats[(r, "B")].metrics[metric], a)
            y = _signed_log_ratio(stats[(r, "A_prime")].metrics[metric], a)
            if x is not None:
                lb.append(x)
            if y is not None:
                lc.append(y)
        effect[metric] = asdict(interval(lb, alpha, p.power))
        control[metric] = asdict(interval(lc, alpha, p.power))
    eff, ctl = interval_of(effect[PRIMARY]), interval_of(control[PRIMARY])
    res = BandResult(band, Verdict.NEUTRAL, None, rounds, effect, control, ctl.excludes_zero(), completed)
    if eff.lo is None or eff.hi is None:
        res.verdict, res.reason = Verdict.VOID, f"no {PRIMARY} interval (a pass without throughput)"
    elif eff.lo > 0:
        res.verdict = Verdict.GAIN
    elif eff.hi < 0:
        res.verdict = Verdict.REGRESSION
    return res


def interval_of(d: dict[str, Any]) -> Interval:
    return Interval(**d)


@dataclass
class RunResult:
    verdict: Verdict  # void, else the worst band verdict (regression > neutral/gain); gain when any band gains
    reason: str | None
    bands: list[BandResult]
    control_flagged: list[str]  # bands whose control shows an effect

    def as_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict.value, "reason": self.reason, "bands": [b.as_dict() for b in self.bands],
                "control_flagged": self.control_flagged}


def run_verdict(bands: list[BandResult], void_reasons: Sequence[str] = ()) -> RunResult:
    """void_reasons: what voids the whole run besides the control (engagement, accuracy)."""
    flagged = [b.band for b in bands if b.control_flags and b.verdict is not Verdict.VOID]
    reasons = list(void_reasons)
    if flagged:
        reasons.insert(0, "the identical-arm control (A vs A') shows an effect at the run's confidence in band(s) "
                          f"{', '.join(flagged)}: a noisy node, nothing is booked")
    if reasons:
        return RunResult(Verdict.VOID, "; ".join(reasons), bands, flagged)
    if bands and all(b.verdict is Verdict.VOID for b in bands):
        return RunResult(Verdict.VOID, "every band is void: " + "; ".join(f"{b.band}: {b.reason}" for b in bands),
                         bands, flagged)
    vs = {b.verdict for b in bands}
    v = (Verdict.REGRESSION if Verdict.REGRESSION in vs else Verdict.GAIN if Verdict.GAIN in vs
         else Verdict.NEUTRAL)
    return RunResult(v, None, bands, flagged)


def promotable(result: dict[str, Any], max_loss: float = 0.05) -> str | None:
    """Why a booked run does not promote its version (None: it does). The rule: the run is not void; no band
    regresses (its throughput interval lies below 0: a loss the run tells from noise); no band is void (a band
    nobody measured is not known to be safe); and every band's interval rules out a loss of more than max_loss
    (a run too noisy to see a loss that size, its MDE above it, cannot vouch that there is none)."""
    if result.get("verdict") == Verdict.VOID.value:
        return f"the run is void: {result.get('reason')}"
    bad = [f"{b['band']} regresses ({_pct(b['effect'][PRIMARY])})" for b in result["bands"]
           if b["verdict"] == Verdict.REGRESSION.value]
    bad += [f"{b['band']} is void ({b['reason']})" for b in result["bands"] if b["verdict"] == Verdict.VOID.value]
    bad += [f"{b['band']} cannot rule out a loss above {max_loss:.0%} ({_pct(b['effect'][PRIMARY])}, MDE "
            f"{100 * b['effect'][PRIMARY]['mde']:.1f}%): too noisy to vouch for it" for b in result["bands"]
            if b["verdict"] in (Verdict.NEUTRAL.value, Verdict.GAIN.value)
            and b["effect"][PRIMARY].get("lo") is not None and b["effect"][PRIMARY]["lo"] < -max_loss]
    return "; ".join(bad) or None


def _pct(d: dict[str, Any]) -> str:
    if d.get("effect") is None:
        return "no estimate"
    return f"{100 * d['effect']:+.1f}% [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]"
