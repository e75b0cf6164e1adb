"""Reading, writing and merging AITER CSV tables the way AITER does (aiter/jit/core.py:266-401)."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

from app.domain.families import TableFamily
from app.domain.headers import parse_header_line
from app.domain.keys import row_key


@dataclass
class Table:
    header: tuple[str, ...]
    rows: list[dict[str, str]] = field(default_factory=list)
    name: str = ""


def read_table(text: str, name: str = "") -> Table:
    lines = text.splitlines()
    if not lines or not lines[0].strip():
        raise ValueError(f"{name or 'table'}: empty, expected a CSV header")
    header = parse_header_line(lines[0])
    rows = []
    for rec in csv.reader(io.StringIO("\n".join(lines[1:]))):
        if not rec or not any(c.strip() for c in rec):
            continue
        # pandas fills a short row with NaN; keep cells as written (no strip: AITER does not strip either)
        rows.append({c: (rec[i].rstrip("\t") if i < len(rec) else "") for i, c in enumerate(header)})
    return Table(header, rows, name)


def render_csv(header: tuple[str, ...], rows: list[dict[str, str]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for r in rows:
        w.writerow([r.get(c, "") for c in header])
    return buf.getvalue()


def _us(row: dict[str, str]) -> float:
    try:
        return float(row.get("us", "") or "inf")
    except ValueError:
        return float("inf")


def union_header(tables: list[Table]) -> tuple[str, ...]:
    """First table's order; a column only later tables have goes before tflops (core.py:289-308)."""
    cols = list(tables[0].header)
    for t in tables[1:]:
        for c in t.header:
            if c not in cols:
                cols.insert(cols.index("tflops") if "tflops" in cols else len(cols), c)
    return tuple(cols)


def merge(family: TableFamily, tables: list[Table]) -> Table:
    """One table with unique merge keys. AITER's rule: lowest us wins, ties to the earlier file; rows keep
    the position of the first row of their key."""
    header = union_header(tables)
    keys = family.merge_key(header)
    best: dict[tuple, tuple[int, dict[str, str]]] = {}
    order = 0
    for t in tables:
        for r in t.rows:
            k = row_key(keys, r)
            full = {c: r.get(c, "") for c in header}
            old = best.get(k)
            if old is None:
                best[k] = (order, full)
                order += 1
            elif _us(full) < _us(old[1]):
                best[k] = (old[0], full)
    return Table(header, [r for _, r in sorted(best.values(), key=lambda x: x[0])], "merged")
