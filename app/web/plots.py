"""Server-side SVG: cumulative served-time coverage against the worker time spent (GPU or CPU)."""

from __future__ import annotations

import math
from html import escape


def _nice_step(span: float, ticks: int = 5) -> float:
    """1, 2 or 5 times a power of ten, so that about `ticks` ticks cover the span."""
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _time_axis(xmax: float) -> tuple[str, float]:
    """The unit the x axis is labelled in, and seconds per unit."""
    return ("h", 3600.0) if xmax >= 3 * 3600 else (("min", 60.0) if xmax >= 180 else ("s", 1.0))


def coverage_svg(points: list[tuple[float, float]], processor: str = "GPU", width: int = 560,
                 height: int = 260) -> str:
    """points: (seconds of worker time spent, share of served time covered), in time order."""
    left, right, top, bottom = 56, 24, 16, 48
    unit, per = _time_axis(max((p[0] for p in points), default=0.0))
    xmax_u = max((p[0] for p in points), default=0.0) / per
    step = _nice_step(xmax_u) if xmax_u > 0 else 1.0
    xmax_u = max(step, math.ceil(xmax_u / step) * step)  # the axis ends on a tick
    pts = [(0.0, 0.0)] + [(x / per, y) for x, y in points]

    def xy(x: float, y: float) -> tuple[float, float]:
        return left + (width - left - right) * x / xmax_u, height - bottom - (height - top - bottom) * y

    # a step line: coverage jumps when a shape's result lands
    path, prev = [], pts[0]
    for p in pts:
        path += [f"{xy(p[0], prev[1])[0]:.1f},{xy(p[0], prev[1])[1]:.1f}", f"{xy(*p)[0]:.1f},{xy(*p)[1]:.1f}"]
        prev = p
    y_ticks = "".join(
        f'<line x1="{left}" x2="{width - right}" y1="{xy(0, f)[1]:.1f}" y2="{xy(0, f)[1]:.1f}" class="grid"/>'
        f'<text x="{left - 6}" y="{xy(0, f)[1] + 4:.1f}" text-anchor="end" class="ytick">{int(f * 100)}%</text>'
        for f in (0, 0.25, 0.5, 0.75, 1.0))
    x_ticks = "".join(
        f'<line x1="{xy(t, 0)[0]:.1f}" x2="{xy(t, 0)[0]:.1f}" y1="{height - bottom}" y2="{height - bottom + 5}" '
        f'class="tick"/><text x="{xy(t, 0)[0]:.1f}" y="{height - bottom + 18}" text-anchor="middle" '
        f'class="xtick">{t:g}</text>'
        for t in (i * step for i in range(int(round(xmax_u / step)) + 1)))
    last = pts[-1]
    label = f"{processor} time spent ({unit})"
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
            f'aria-label="served-time coverage {last[1]:.0%} after {last[0]:g} {unit} of {escape(processor)} time" '
            f'class="plot"><style>.grid{{stroke:#ddd}} .tick{{stroke:#555}} text{{font:11px sans-serif;fill:#555}}'
            f' .line{{fill:none;stroke:#2b6cb0;stroke-width:2}}</style>{y_ticks}{x_ticks}'
            f'<line x1="{left}" x2="{width - right}" y1="{height - bottom}" y2="{height - bottom}" class="tick"/>'
            f'<polyline class="line" points="{" ".join(path)}"/>'
            f'<text x="{(left + width - right) / 2}" y="{height - 8}" text-anchor="middle" class="xlabel">'
            f'{escape(label)}</text>'
            f'<text x="14" y="{(top + height - bottom) / 2}" transform="rotate(-90 14 {(top + height - bottom) / 2})"'
            f' text-anchor="middle" class="ylabel">share of served time covered</text></svg>')
