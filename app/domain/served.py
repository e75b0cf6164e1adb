"""Served time: how a campaign ranks its shapes. Priority = weight x the default path's time per call.

The weight is what the shape is really served:
- with a server's step histogram (vLLM's `vllm:iteration_tokens_total`: tokens per engine step, buckets
  1, 8, 16, ... 8192, +Inf), the engine steps whose token count this shape's M serves;
- without one, its call count (log lines count processes, not calls: AITER prints a lookup once per shape
  per process, so this is the weaker rule, and the campaign says which rule ordered it).
The default path's time is the roofline estimate for the gfx until a worker measures it.

M ranges: every layer runs once per step with M = the step's tokens (MoE: the padded token count). A captured M
stands for the token counts of the histogram bucket that contains it, above the next smaller captured M of its
group (shapes that differ only in M) and up to itself: a CUDA-graph batch runs at the capture size at or above
its tokens, a prefill at exactly its tokens. So Ms sharing one bucket split it instead of each claiming all of
it. Steps in a bucket are taken as spread evenly over its token counts. A row at a padded M (a bucket plan) serves the Ms
that pad to it, so it carries the sum of their weights (app/services/buckets.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from app.domain.families import TableFamily
from app.domain.keys import m_candidates

RULE_STEPS = "served steps x default time"
RULE_CALLS = "calls x default time"
MAX_BUCKETS = 64


class HistogramError(ValueError):
    pass


def bound(le: str) -> float:
    """A bucket's upper bound as Prometheus writes it ('8', '8.0', '+Inf')."""
    try:
        v = float(le)
    except ValueError:
        raise HistogramError(f"bucket bound {le!r} is not a number or +Inf") from None
    if math.isnan(v) or v <= 0:
        raise HistogramError(f"bucket bound {le!r} must be positive")
    return v


def merge(hist: Mapping[str, float] | None, delta: Mapping[str, float]) -> dict[str, float]:
    """Per-bucket step counts added up, keyed by the bound as a canonical string ('8', '+Inf')."""
    out = {canon(k): float(v) for k, v in (hist or {}).items()}
    for k, v in delta.items():
        if v < 0:
            raise HistogramError(f"bucket {k}: a step count cannot be negative ({v})")
        key = canon(k)
        out[key] = out.get(key, 0.0) + float(v)
    if len(out) > MAX_BUCKETS:
        raise HistogramError(f"more than {MAX_BUCKETS} buckets")
    return out


def merge_lengths(hist: Mapping[str, Mapping[str, float]] | None, delta: Mapping[str, Mapping[str, float]]
                  ) -> dict[str, dict[str, float]]:
    """Request length histograms ("prompt", "generation": requests per length bucket) added up, as merge."""
    out = {k: dict(v) for k, v in (hist or {}).items()}
    for kind, d in delta.items():
        out[kind] = merge(out.get(kind), d)
    return out


def canon(le: str) -> str:
    v = bound(str(le))
    return "+Inf" if math.isinf(v) else (str(int(v)) if v.is_integer() else repr(v))


def _steps_in(hist: Sequence[tuple[float, float]], lo: int, hi: int, top: int) -> float:
    """Steps whose token count T is in (lo, hi], buckets (previous bound, bound] spread evenly over integer T."""
    out, prev = 0.0, 0.0
    for le, steps in hist:
        b_hi = max(top, 2 * prev, prev + 1) if math.isinf(le) else le
        width = math.floor(b_hi) - math.floor(prev)
        if width > 0 and steps:
            overlap = min(hi, math.floor(b_hi)) - max(lo, math.floor(prev))
            if overlap > 0:
                out += steps * overlap / width
        prev = le if not math.isinf(le) else prev
    return out


def _bucket_floor(hist: Sequence[tuple[float, float]], m: int) -> int:
    """The lower bound (exclusive) of the bucket holding token count m."""
    prev = 0.0
    for le, _ in hist:
        if m <= le:
            return math.floor(prev)
        prev = le
    return math.floor(prev)


def step_weights(family: TableFamily, shapes: Sequence[Mapping[str, str]],
                 hist: Mapping[str, float]) -> list[float]:
    """Each shape's served steps under the histogram (see the module note for the M ranges)."""
    ordered = sorted((bound(k), float(v)) for k, v in hist.items())
    total = sum(v for _, v in ordered)
    mcol = family.m_column
    if mcol is None:
        return [total for _ in shapes]  # no M: every step runs it
    groups: dict[tuple[object, ...], list[int]] = {}
    for sh in shapes:
        groups.setdefault(tuple((k, v) for k, v in sh.items() if k != mcol), []).append(int(sh[mcol]))
    ranges: dict[tuple[object, ...], dict[int, tuple[int, int]]] = {}
    top = max((int(sh[mcol]) for sh in shapes), default=1)
    for rest, ms in groups.items():
        prev, r = 0, {}
        for m in sorted(set(ms)):
            r[m] = (max(prev, _bucket_floor(ordered, m)), m)
            prev = m
        ranges[rest] = r
    out = []
    for sh in shapes:
        lo, hi = ranges[tuple((k, v) for k, v in sh.items() if k != mcol)][int(sh[mcol])]
        out.append(_steps_in(ordered, lo, hi, top))
    return out


def fold_covered(family: TableFamily, shapes: Sequence[Mapping[str, str]], weights: Sequence[float],
                 covered: Sequence[bool]) -> list[float]:
    """A shape parked as covered by a bucket row is served by the row AITER's lookup reaches first (its M, then
    the padded Ms, app/domain/keys.py), so that row carries its steps as well as its own."""
    mcol = family.m_column
    out = list(weights)
    if mcol is None:
        return out
    rows = {(tuple((k, v) for k, v in sh.items() if k != mcol), int(sh[mcol])): i
            for i, sh in enumerate(shapes) if not covered[i]}
    for i, sh in enumerate(shapes):
        if covered[i]:
            rest = tuple((k, v) for k, v in sh.items() if k != mcol)
            target = next((rows[(rest, m)] for m in m_candidates(family, dict(sh)) if (rest, m) in rows), None)
            if target is not None:
                out[target] += weights[i]
    return out


def rule(step_hist: Mapping[str, float] | None) -> str:
    """Which rule orders a campaign: served steps once any capture brought a step histogram."""
    return RULE_STEPS if step_hist else RULE_CALLS


def priority(calls: int, steps: float | None, default_us: float) -> float:
    """Served time of a shape: its served steps when the campaign has a histogram, else its calls."""
    return (steps if steps is not None else calls) * default_us
