"""When a tuned row is worth deploying: AITER's own --compare --update_improved rule, one home for the
service and both backends."""

from __future__ import annotations

MIN_IMPROVEMENT_PCT = 3.0  # AITER's --min_improvement_pct default (aiter/utility/base_tuner.py:54)


def improvement_pct(us: float, default_us: float) -> float:
    """(pre_us - post_us) / pre_us * 100, as base_tuner.py:963-967 computes it."""
    return (default_us - us) / default_us * 100.0


def row_helps(us: float | None, default_us: float | None, min_improvement_pct: float = MIN_IMPROVEMENT_PCT) -> bool:
    """A row goes into the overlay only when the winner beats the default path by at least the margin
    (base_tuner.py:918-975, _build_compare_update_plan: "threshold_met"). With no timed default there is
    nothing to compare, and the row goes in, as AITER's "no_baseline" case does."""
    if us is None:
        return False
    if default_us is None or default_us <= 0:
        return True
    return improvement_pct(us, default_us) >= min_improvement_pct
