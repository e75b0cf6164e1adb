"""Captured shapes from a server: JSON shapes with counts, an AITER untuned CSV, or raw server log text."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from app.domain.families import TableFamily, lookup_identity
from app.domain.headers import parse_header_line, untuned_header_ok
from app.domain.log_lines import LogEvent, parse_log
from app.domain.shapes import Shape, ShapeError, make_shape

MAX_SHAPES = 100_000


@dataclass
class ParsedCapture:
    shapes: dict[str, tuple[Shape, int]] = field(default_factory=dict)  # key -> (shape, call count)
    notes: list[str] = field(default_factory=list)
    limit: int = MAX_SHAPES  # distinct shapes one capture may carry (Settings.max_capture_shapes)

    def add(self, shape: Shape, count: int) -> None:
        old = self.shapes.get(shape.key)
        self.shapes[shape.key] = (shape, count + (old[1] if old else 0))
        if len(self.shapes) > self.limit:
            raise ShapeError("shapes", f"more than {self.limit} distinct shapes in one capture; send it in parts")


MAX_COUNT = 1 << 40  # calls of one shape in one capture (~10^12): far above any server's, far below int64


def _count(raw: object, where: str) -> int:
    s = str(raw).strip()
    if isinstance(raw, bool) or not isinstance(raw, (int, str)) or not s.isdigit() or len(s) > 20:
        raise ShapeError(where, f"expected a non-negative integer call count, got {str(raw)[:40]!r}")
    if int(s) > MAX_COUNT:
        raise ShapeError(where, f"call count {s} is above the cap {MAX_COUNT}")
    return int(s)


def from_json(family: TableFamily, shapes: Sequence[Mapping[str, object]], limit: int = MAX_SHAPES) -> ParsedCapture:
    out = ParsedCapture(limit=limit)
    if not shapes:
        raise ShapeError("shapes", "empty: a capture needs at least one shape")
    for i, item in enumerate(shapes):
        where = f"shapes[{i}]"
        if not isinstance(item, dict):
            raise ShapeError(where, "expected an object of shape columns")
        raw = dict(item)
        count = _count(raw.pop("count", 1), f"{where}.count")
        out.add(make_shape(family, raw, where), count)
    return out


def from_untuned_csv(family: TableFamily, text: str, limit: int = MAX_SHAPES) -> ParsedCapture:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ShapeError("untuned_csv", "empty: expected a header line and rows")
    header = parse_header_line(lines[0])
    has_count = "count" in header
    problems = untuned_header_ok(family, tuple(c for c in header if c != "count"))
    if problems:
        raise ShapeError("untuned_csv.header", f"{'; '.join(problems)} for family {family.name} "
                                               f"(expected {','.join(family.untuned_header)})")
    keep = [c for c in header if c in family.shape_columns]
    out = ParsedCapture(limit=limit)
    for lineno, row in enumerate(csv.reader(io.StringIO("\n".join(lines[1:]))), start=2):
        cells = [c.strip() for c in row]
        if len(cells) > len(header) and not any(cells[len(header):]):
            cells = cells[:len(header)]
        if len(cells) != len(header):
            raise ShapeError(f"untuned_csv.line{lineno}", f"expected {len(header)} cells, got {len(cells)}")
        d = dict(zip(header, cells))
        count = _count(d["count"], f"untuned_csv.line{lineno}.count") if has_count else 1
        out.add(make_shape(family, {c: d[c] for c in keep}, f"untuned_csv.line{lineno}"), count)
    if not out.shapes:
        raise ShapeError("untuned_csv", "no rows under the header")
    return out


def from_events(family: TableFamily, events: list[LogEvent], gfx: str, cu_num: int,
                strict: bool = True, limit: int = MAX_SHAPES, env: dict[str, str] | None = None) -> ParsedCapture:
    """The family's shapes among parsed lookup lines, one call per line; lines naming another identity than
    the lookup's on this GPU (gfx, cu_num) under the serving environment env (GPU_ARCHS, CU_NUM:
    families.lookup_identity) skipped. The service (a posted log) and the capture agent (a followed log) both
    count lines this way. strict: a line whose shape is not valid refuses the whole capture; else it is skipped
    with a note (the agent, which must keep following)."""
    out = ParsedCapture(limit=limit)
    other = mismatched = 0
    li = lookup_identity(family, gfx, cu_num, env or {})
    for ev in events:
        if ev.family != family.name:
            other += 1
            continue
        if (ev.gfx and ev.gfx != li.gfx) or (ev.cu_num is not None and ev.cu_num != li.cu_num):
            mismatched += 1  # the server's AITER saw another identity than the capture claims
            continue
        try:
            shape = make_shape(family, ev.shape, "log")
        except ShapeError as e:
            if strict:
                raise
            out.notes.append(f"line skipped: {e}")
            continue
        out.add(shape, 1)
    if other:
        out.notes.append(f"{other} AITER lookup line(s) of other families skipped")
    if mismatched:
        out.notes.append(f"{mismatched} line(s) name another gfx/cu_num than the capture and were skipped")
    return out


def from_log(family: TableFamily, text: str, gfx: str, cu_num: int, limit: int = MAX_SHAPES,
             env: dict[str, str] | None = None) -> ParsedCapture:
    out = from_events(family, parse_log(text).events, gfx, cu_num, limit=limit, env=env)
    if not out.shapes:
        raise ShapeError("log", f"no AITER {family.name} lookup lines ('not found tuned config' or "
                                f"'is tuned on cu_num') found in {len(text.splitlines())} line(s)")
    return out
