"""The serving A/B's statistics (issue 32): pure functions over the per-request records of a run's passes.

A run measures each band in rounds; a round runs every arm once, in an order that reverses from one round to the
next in mirrored pairs (A B A' then A' B A; B A' A then A A' B; ...), so a linear drift of the node adds +d to one
round's B/A ratio and -d to the next one's, and cancels in their mean; over six rounds every arm takes every
position equally often (`ROUND_ORDERS`, a Williams design), so nothing tied to a position in the round falls on one
arm. Runs whose rounds come in multiples of six (the default 6, extensions of 6) are balanced at every look. Per
band and metric, each pass gives one number (the unit of replication: requests inside a pass share its moment on the
node, so they are not independent replicates); the effect of B (and of the control A') is the geometric mean of its
per-round ratio to the A of the same round, with a Student-t interval whose variance comes from the round x arm
table's residual (rounds as blocks: `block_intervals`). The drift left in single rounds widens the interval
(conservative), it does not bias it.

Sequential rounds (`looks`, `undecided`): a band measured in the run's `repeats` rounds whose interval holds 0 and
is still too wide (its MDE above the run's target, or it cannot rule out a loss above max_loss) gets EXTEND_ROUNDS
more rounds (one cycle of the round orders), again and again up to `max_repeats`; a band that is decided stops. Each
band is looked at up to L = 1 + ceil((max_repeats - repeats) / EXTEND_ROUNDS) times, and with k bands every
interval, at every look, is made at confidence 1 - alpha/(k L) (Bonferroni over bands and looks), so the run's
chance of a false verdict, and of a false control alarm, stays at alpha whatever the number of bands and however the
looks fall.

Stdlib only (the service has no numpy/scipy): the t quantile comes from the regularized incomplete beta function
(continued fraction, Numerical Recipes 6.4) inverted by bisection.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from app.ab_wire import RequestRecord
from app.domain.student_t import t_ppf


class Verdict(StrEnum):
    GAIN = "gain"
    NEUTRAL = "neutral"
    REGRESSION = "regression"
    VOID = "void"


# metric -> True when higher is better. The verdict is made on PRIMARY, the decode rate at the band's concurrency
# (1 / the mean time per output token while the band's `concurrency` requests decode together: _decode_rate), so a
# kernel's effect on decoding at that batch is read whole; the pass's output tok/s (tokens over the pass's span)
# dilutes it with TTFT, connection set-up and the pass's ramp and drain, where fewer sequences decode (measured:
# +5.3-5.8% read for a planted +8%, benchmarks/RESULTS.md). Output tok/s, TTFT and ITL are reported beside it.
METRICS: dict[str, bool] = {"decode_tok_s": True, "output_tok_s": True, "ttft_p50": False, "ttft_p99": False,
                            "itl_p50": False, "itl_p99": False}
PRIMARY = "decode_tok_s"


# The arms' order in each round: a Williams design for three arms (Williams 1949, Aust. J. Sci. Res. 2:149), six
# orders in mirrored pairs. A round and the next run the same arms reversed (ABBA), so a linear drift cancels over
# each pair; over the six, every arm takes every position twice and follows every other arm twice (first-order
# carry-over balanced). The former A B A' / A' B A measured B second in every round: whatever the middle of a round
# does (the node just after another server's load) fell on B alone, and the control never showed it.
ROUND_ORDERS: tuple[tuple[str, str, str], ...] = (
    ("A", "B", "A_prime"), ("A_prime", "B", "A"),
    ("B", "A_prime", "A"), ("A", "A_prime", "B"),
    ("A_prime", "A", "B"), ("B", "A", "A_prime"))


def round_order(repeat: int) -> tuple[str, ...]:
    """The arms' order in round `repeat` (ROUND_ORDERS, cycled)."""
    return ROUND_ORDERS[repeat % len(ROUND_ORDERS)]


# The orders the driver may start the arms' servers in: A between the other two. A server drifts with its own age
# (warm-up, heat, caches, its allocator), and servers started one after another differ in age: with A in the
# middle, B and A' are as far from A's age as each other, on opposite sides, so what the start order does to B it
# does to the control too, which shows it (A, A', B put B twice as far from A as the control: the control showed a
# third of B's offset, unflagged). Which of B and A' goes first is drawn per run, so neither is always oldest. The
# driver starts the three together in this order (app/ab_driver.py), so what is left of the gap is small.
START_ORDERS: tuple[tuple[str, str, str], ...] = (("B", "A", "A_prime"), ("A_prime", "A", "B"))


def draw_start_order(rng: random.Random | None = None) -> tuple[str, str, str]:
    return (rng or random.SystemRandom()).choice(START_ORDERS)


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


def _throughput(ok: Sequence[RequestRecord]) -> float | None:
    """Output tokens over the pass's span (first request's start to last token)."""
    t0 = min(r.started_s for r in ok)
    t1 = max(r.started_s + (r.latency_s or 0.0) for r in ok)
    return sum(r.output_tokens for r in ok) / (t1 - t0) if t1 > t0 else None


def _full_periods(ok: Sequence[RequestRecord], concurrency: int) -> list[tuple[float, float]]:
    """When `concurrency` requests were decoding at once (from a request's first token to its last), or the most
    that ever did where the pass never had that many decoding together (a client too slow to keep them in flight)."""
    ev = sorted([(r.started_s + (r.ttft_s or 0.0), 1) for r in ok] +
                [(r.started_s + (r.latency_s or 0.0), -1) for r in ok])  # at a tie an end comes first
    n, peak = 0, 0
    for _, d in ev:
        n += d
        peak = max(peak, n)
    concurrency = min(concurrency, peak)
    out, n, t0 = [], 0, None
    for t, d in ev:
        n += d
        if n >= concurrency and t0 is None:
            t0 = t
        elif n < concurrency and t0 is not None:
            out.append((t0, t))
            t0 = None
    return out


def _decode_rate(ok: Sequence[RequestRecord], concurrency: int | None) -> float | None:
    """Decode tokens/s per sequence at the band's operating point: 1 / the mean time per output token (vLLM's TPOT)
    over the requests, each counted while `concurrency` requests were decoding together (steady state: a pass's
    ramp-up, while its requests are still starting, and its drain, while they end, run a smaller batch than the
    band's, and a server's speed depends on its batch: measured, a planted +8% at 16 running read +6.5% over whole
    requests and +7.6% in the steady window, benchmarks/RESULTS.md). A request's token times are its first token and
    the streamed chunks after it; where chunks carry several tokens (vLLM merges them) a chunk counts as the
    request's mean tokens per chunk. concurrency None: over whole requests, first token to last."""
    full = _full_periods(ok, concurrency) if concurrency else None
    tpot = []
    for r in ok:
        if r.output_tokens < 2 or r.ttft_s is None or r.latency_s is None or r.latency_s <= r.ttft_s:
            continue
        if full is None:
            tpot.append((r.latency_s - r.ttft_s) / (r.output_tokens - 1))
            continue
        stamps = [r.started_s + r.ttft_s]
        for g in r.itl_s:
            stamps.append(stamps[-1] + g)
        inside = [t for t in stamps if any(a <= t <= b for a, b in full)]
        if len(inside) >= 3:
            per_chunk = (r.output_tokens - 1) / max(1, len(stamps) - 1)
            tpot.append((inside[-1] - inside[0]) / ((len(inside) - 1) * per_chunk))
    return len(tpot) / sum(tpot) if tpot else None


def pass_stats(records: Iterable[RequestRecord], concurrency: int | None = None) -> PassStats:
    recs = list(records)
    ok = [r for r in recs if r.error is None and r.output_tokens > 0 and r.latency_s is not None]
    errs = [r for r in recs if r.error is not None]
    m: dict[str, float | None] = dict.fromkeys(METRICS)
    if ok:
        m["output_tok_s"], m["decode_tok_s"] = _throughput(ok), _decode_rate(ok, concurrency)
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
    """A one-sample t interval over per-round log-ratios (df = n - 1)."""
    n = len(log_ratios)
    if n < 2:
        return Interval(n)
    mean = sum(log_ratios) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in log_ratios) / (n - 1))
    return _interval(n, mean, sd / math.sqrt(n), n - 1, alpha, power)


def _interval(n: int, mean: float, se: float, df: float, alpha: float, power: float) -> Interval:
    tq = t_ppf(1 - alpha / 2, df)
    mde = (tq + t_ppf(power, df)) * se
    return Interval(n, math.expm1(mean), math.expm1(mean - tq * se), math.expm1(mean + tq * se), math.expm1(mde))


def block_intervals(rows: Sequence[Sequence[float]], alpha: float, power: float) -> list[Interval]:
    """Rounds as blocks (a randomized complete block design): rows[k] = the log metric of every arm in round k,
    the first arm the reference. Each other arm's effect is its mean log-ratio to the reference over rounds; its
    standard error comes from the residual of the two-way (round x arm) table, sigma^2 = SS_res / ((K-1)(J-1)),
    SE = sqrt(2 sigma^2 / K), with (K-1)(J-1) degrees of freedom. The unit of replication stays the pass (one
    number per arm and round: no pseudo-replication by requests); the control arm's passes estimate the same
    pass-to-pass variance as B's, so three arms give twice the degrees of freedom of B's K-1 per-round ratios. A
    round's shared drift is its block effect and drops out; what drift is left inside rounds goes to the residual
    (wider, not biased)."""
    k = len(rows)
    j = len(rows[0]) if rows else 0
    if k < 2 or j < 2:
        return [Interval(k) for _ in range(max(0, j - 1))]
    grand = sum(map(sum, rows)) / (k * j)
    row_m = [sum(r) / j for r in rows]
    col_m = [sum(r[c] for r in rows) / k for c in range(j)]
    ss = sum((rows[i][c] - row_m[i] - col_m[c] + grand) ** 2 for i in range(k) for c in range(j))
    df = (k - 1) * (j - 1)
    se = math.sqrt(2 * ss / df / k)
    return [_interval(k, col_m[c] - col_m[0], se, df, alpha, power) for c in range(1, j)]


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


# rounds an undecided band gets at a time: one cycle of ROUND_ORDERS, so every look that follows a whole number of
# cycles has every arm in every place equally often (4, two mirrored pairs, left B second in 4 of 8 rounds)
EXTEND_ROUNDS = 6


def looks(repeats: int, max_repeats: int | None) -> int:
    """How many times a band may be looked at: after `repeats` rounds, then after each extension."""
    return 1 + math.ceil(max(0, (max_repeats or repeats) - repeats) / EXTEND_ROUNDS)


def undecided(b: BandResult, target_mde: float, max_loss: float) -> bool:
    """The stopping rule: a band is measured on while its primary interval holds 0 and it is still too wide to
    vouch for anything: its MDE above target_mde (it could miss an effect that size), or its lower end below
    -max_loss (it cannot rule out a loss promotion must exclude). A gain, a regression, a void band (too few
    requests) and a neutral band that is precise enough all stop."""
    if b.verdict is not Verdict.NEUTRAL or not b.effect:
        return False
    e = interval_of(b.effect[PRIMARY])
    return (e.mde is not None and e.mde > target_mde) or (e.lo is not None and e.lo < -max_loss)


@dataclass(frozen=True)
class GateParams:
    confidence: float = 0.95  # the run's: every verdict and the control at once (Bonferroni over bands and looks)
    power: float = 0.8  # for the minimum detectable effect
    min_requests: int = 4  # completed requests an arm needs in every pass of a band
    max_error_frac: float = 0.1  # more failed requests than this in a pass voids the band
    min_rounds: int = 2
    looks: int = 1  # the most looks a band may get (sequential rounds: `looks`)
    min_effect: float = 0.0  # a significant effect smaller than this is neutral, within margin (RunIn.min_effect)


BLOCK_ARMS = ("A", "B", "A_prime")  # the reference first: B's and A_prime's effects are against A


def _pass_table(band: str, passes: dict[tuple[int, str], list[RequestRecord]], rounds: int, p: GateParams,
                concurrency: int | None) -> tuple[dict[tuple[int, str], PassStats], dict[str, int], BandResult | None]:
    """Every pass's statistics and each arm's completed requests, or the void result naming the first pass that
    is missing, has too few requests or too many errors."""
    stats: dict[tuple[int, str], PassStats] = {}
    completed: dict[str, int] = {"A": 0, "A_prime": 0, "B": 0}
    for r in range(rounds):
        for arm in ("A", "A_prime", "B"):
            recs = passes.get((r, arm))
            if recs is None:
                return stats, completed, BandResult(band, Verdict.VOID, f"pass {r} of arm {arm} was not measured",
                                                    rounds)
            st = stats[(r, arm)] = pass_stats(recs, concurrency)
            completed[arm] += st.completed
            why = None
            if st.completed < p.min_requests:
                why = (f"too few requests: arm {arm} pass {r} completed {st.completed} of {st.requests} (at least "
                       f"{p.min_requests} needed)" + (f"; first error: {st.first_error}" if st.first_error else ""))
            elif st.errors > p.max_error_frac * st.requests:
                why = (f"arm {arm} pass {r}: {st.errors} of {st.requests} requests failed (more than "
                       f"{p.max_error_frac:.0%}); first error: {st.first_error}")
            if why:
                return stats, completed, BandResult(band, Verdict.VOID, why, rounds, requests=completed)
    return stats, completed, None


def analyse_band(band: str, passes: dict[tuple[int, str], list[RequestRecord]], rounds: int, n_bands: int,
                 p: GateParams, concurrency: int | None = None) -> BandResult:
    """passes: (repeat, arm) -> that pass's records, for repeats 0..rounds-1 and every arm; concurrency: the
    band's (its decode rate is measured while that many requests decode together)."""
    alpha = (1 - p.confidence) / max(1, n_bands) / max(1, p.looks)
    stats, completed, void = _pass_table(band, passes, rounds, p, concurrency)
    if void is not None:
        return void
    if rounds < p.min_rounds:
        return BandResult(band, Verdict.VOID, f"{rounds} round(s); at least {p.min_rounds} are needed for an "
                          "interval", rounds, requests=completed)
    effect, control = {}, {}
    for metric in METRICS:
        table = [[stats[(r, a)].metrics[metric] for a in BLOCK_ARMS] for r in range(rounds)]
        rows = [[math.log(x) for x in xs] for xs in table if all(x is not None and x > 0 for x in xs)]  # type: ignore[arg-type]
        ib, ic = block_intervals(rows, alpha, p.power) if rows else (Interval(0), Interval(0))
        effect[metric], control[metric] = asdict(ib), asdict(ic)
    eff, ctl = interval_of(effect[PRIMARY]), interval_of(control[PRIMARY])
    res = BandResult(band, Verdict.NEUTRAL, None, rounds, effect, control, ctl.excludes_zero(), completed)
    if eff.lo is None or eff.hi is None:
        res.verdict, res.reason = Verdict.VOID, f"no {PRIMARY} interval (a pass without throughput)"
    elif eff.excludes_zero() and eff.effect is not None and abs(eff.effect) < p.min_effect:
        res.reason = (f"within margin: {100 * eff.effect:+.2f}% is significant but smaller than the run's smallest "
                      f"effect of interest ({100 * p.min_effect:.1f}%)")
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
