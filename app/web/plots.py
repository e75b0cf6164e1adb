"""Server-side SVG: cumulative served-time coverage against GPU time spent."""

from __future__ import annotations

from html import escape


def coverage_svg(points: list[tuple[float, float]], width: int = 560, height: int = 240) -> str:
    """points: (GPU seconds spent, share of served time covered), in time order, starting from (0, 0)."""
    pad = 52
    xmax = max((p[0] for p in points), default=1.0) or 1.0
    pts = [(0.0, 0.0)] + points

    def xy(x: float, y: float) -> tuple[float, float]:
        return pad + (width - 2 * pad) * x / xmax, height - pad - (height - 2 * pad) * y

    # a step line: coverage jumps when a shape's result lands
    path, prev = [], pts[0]
    for p in pts:
        x0, y0 = xy(p[0], prev[1])
        x1, y1 = xy(p[0], p[1])
        path += [f"{x0:.1f},{y0:.1f}", f"{x1:.1f},{y1:.1f}"]
        prev = p
    last = pts[-1]
    grid = "".join(
        f'<line x1="{pad}" x2="{width - pad}" y1="{xy(0, f)[1]:.1f}" y2="{xy(0, f)[1]:.1f}" class="grid"/>'
        f'<text x="{pad - 6}" y="{xy(0, f)[1] + 4:.1f}" text-anchor="end">{int(f * 100)}%</text>'
        for f in (0, 0.25, 0.5, 0.75, 1.0))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
            f'aria-label="served-time coverage {last[1]:.0%} after {last[0]:.1f} GPU s" class="plot">'
            f'<style>.grid{{stroke:#ddd}} text{{font:11px sans-serif;fill:#555}} .line{{fill:none;stroke:#2b6cb0;'
            f'stroke-width:2}}</style>{grid}'
            f'<polyline class="line" points="{" ".join(path)}"/>'
            f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle">GPU seconds spent '
            f'(0 to {escape(f"{xmax:.1f}")})</text>'
            f'<text x="12" y="{height / 2}" transform="rotate(-90 12 {height / 2})" text-anchor="middle">'
            f'served time covered</text></svg>')
