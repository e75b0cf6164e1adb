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


VERDICT_COLOURS = {"gain": "#2f855a", "neutral": "#718096", "regression": "#c53030", "void": "#b7791f"}


def ab_svg(bands: list[dict], metric: str | None = None, width: int = 560, row_h: int = 44) -> str:
    """Per band: B's effect against A on the metric with its interval (a bar), the identical-arm control's
    (a thin grey bar below it), +-MDE ticks, coloured by the band's verdict. metric: the verdict's (the decode
    rate; a run booked before it was measured: output tok/s)."""
    if metric is None:
        metric = "decode_tok_s" if any("decode_tok_s" in b.get("effect", {}) for b in bands) else "output_tok_s"
    left, right, top = 150, 24, 24
    height = top + row_h * max(1, len(bands)) + 36
    vals = [0.0]
    for b in bands:
        for side in ("effect", "control"):
            d = b.get(side, {}).get(metric) or {}
            vals += [x for x in (d.get("lo"), d.get("hi"), d.get("mde")) if x is not None]
    span = max(0.02, max(abs(v) for v in vals) * 1.15)
    step = _nice_step(2 * span, 4)
    span = math.ceil(span / step) * step

    def x(v: float) -> float:
        return left + (width - left - right) * (v + span) / (2 * span)

    parts = []
    t = -span
    while t <= span + 1e-12:
        parts.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top - 6}" y2="{height - 30}" class="grid"/>'
                     f'<text x="{x(t):.1f}" y="{height - 16}" text-anchor="middle">{100 * t:+.0f}%</text>')
        t += step
    parts.append(f'<line x1="{x(0):.1f}" x2="{x(0):.1f}" y1="{top - 6}" y2="{height - 30}" class="zero"/>')
    for i, b in enumerate(bands):
        y = top + row_h * i + 12
        colour = VERDICT_COLOURS.get(b.get("verdict", ""), "#000")
        parts.append(f'<text x="{left - 8}" y="{y + 4}" text-anchor="end">{escape(b["band"])}</text>'
                     f'<text x="{left - 8}" y="{y + 18}" text-anchor="end" style="fill:{colour}">'
                     f'{escape(b.get("verdict", ""))}</text>')
        e = (b.get("effect") or {}).get(metric) or {}
        if e.get("lo") is not None:
            parts.append(f'<line x1="{x(e["lo"]):.1f}" x2="{x(e["hi"]):.1f}" y1="{y}" y2="{y}" '
                         f'style="stroke:{colour};stroke-width:6"/>'
                         f'<circle cx="{x(e["effect"]):.1f}" cy="{y}" r="5" style="fill:{colour}"/>')
            for m in (-e["mde"], e["mde"]):
                parts.append(f'<line x1="{x(m):.1f}" x2="{x(m):.1f}" y1="{y - 8}" y2="{y + 8}" class="mde"/>')
        ctl = (b.get("control") or {}).get(metric) or {}
        if ctl.get("lo") is not None:
            parts.append(f'<line x1="{x(ctl["lo"]):.1f}" x2="{x(ctl["hi"]):.1f}" y1="{y + 14}" y2="{y + 14}" '
                         f'class="control"/>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" class="plot" '
            f'aria-label="effect of B against A on {escape(metric)} per band, with intervals">'
            f'<style>.grid{{stroke:#eee}} .zero{{stroke:#333}} .mde{{stroke:#999;stroke-dasharray:2,2}} '
            f'.control{{stroke:#a0aec0;stroke-width:3}} text{{font:11px sans-serif;fill:#555}}</style>'
            f'{"".join(parts)}<text x="{(left + width - right) / 2}" y="{height - 2}" text-anchor="middle">'
            f'{escape(metric)}: B vs A (bar: interval, dot: effect, dashes: +-MDE, grey: A\' vs A)</text></svg>')
