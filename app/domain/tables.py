"""Reading, writing and merging AITER CSV tables the way AITER does (aiter/jit/core.py:266-401)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from dataclasses import dataclass, field

from app.domain.families import AiterRelease, TableFamily, gfx_from_cu_num
from app.domain.headers import parse_header_line
from app.domain.keys import row_key


@dataclass
class Table:
    header: tuple[str, ...]
    rows: list[dict[str, str]] = field(default_factory=list)
    name: str = ""
    preamble: tuple[str, ...] = ()  # comment lines above the header (TableFamily.comment_prefix)


def is_comment(line: str, prefix: str | None) -> bool:
    return prefix is not None and line.lstrip().startswith(prefix)


def read_table(text: str, name: str = "", comment: str | None = None) -> Table:
    """The file as pandas reads it (no comment= anywhere in AITER's merge): a comment line below the header is a
    row (the family's loader drops it: engagement.loaded_rows). comment: the family's comment_prefix, whose
    loader finds its header below comment lines; they are kept as the preamble."""
    lines = text.splitlines()
    lead = 0
    while lead < len(lines) and is_comment(lines[lead], comment):
        lead += 1
    preamble, lines = tuple(lines[:lead]), lines[lead:]
    if not lines or not lines[0].strip():
        raise ValueError(f"{name or 'table'}: empty, expected a CSV header")
    header = parse_header_line(lines[0])
    rows = []
    for rec in csv.reader(io.StringIO("\n".join(lines[1:]))):
        if not rec or not any(c.strip() for c in rec):
            continue
        # pandas fills a short row with NaN; keep cells as written (no strip: AITER does not strip either)
        rows.append({c: (rec[i].rstrip("\t") if i < len(rec) else "") for i, c in enumerate(header)})
    return Table(header, rows, name, preamble)


def rows_digest(table: Table) -> str:
    """A digest of the table's header and rows, cell by cell (what a lookup on it can depend on)."""
    return hashlib.blake2b(json.dumps([table.header, table.rows], default=str).encode(), digest_size=16).hexdigest()


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
    """First table's order; a column only later tables have goes before tflops, else before the last column
    (core.py:289-296)."""
    cols = list(tables[0].header)
    for t in tables[1:]:
        for c in t.header:
            if c not in cols:
                cols.insert(cols.index("tflops") if "tflops" in cols else len(cols) - 1, c)
    return tuple(cols)


_FILL = {"xbf16": "0", "run_1stage": "0", "ksplit": "0"}


def filled_rows(t: Table, header: tuple[str, ...], live_gfx: str) -> list[dict[str, str]]:
    """A table's rows in the merged header, cells it lacks filled as AITER fills them: gfx from cu_num
    (gfx_from_cu_num), every other column 0 (core.py:297-308); _tag NaN reads as '' (:315-317)."""
    out = []
    for r in t.rows:
        row = {}
        for c in header:
            if c in t.header:
                row[c] = r.get(c, "")
            elif c == "gfx" and "cu_num" in t.header:
                row[c] = gfx_from_cu_num(r.get("cu_num", ""), live_gfx)
            else:
                row[c] = _FILL.get(c, "0")
        out.append(row)
    return out


# pandas' default NA strings (read_csv na_values): read as NaN, written back blank
_NA = frozenset({"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>",
                 "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"})
_INT_TEXT = re.compile(r"[+-]?\d+")
_FLOAT_TEXT = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?|[+-]?inf")


def _dtype(cells: list[str]) -> str:
    """pandas' dtype of one file's column: int64, float64 (numbers with a NaN or a fraction) or object."""
    kind = "int"
    for c in cells:
        if c.isdecimal():  # the common cells without the regexes: \d+ (an integer, never NA) ...
            continue
        if c.replace(".", "", 1).isdecimal() and "." in c:  # ... and \d+\.\d* or \.\d+ (a fraction)
            kind = "float"
            continue
        if c in _NA or _FLOAT_TEXT.fullmatch(c) and not _INT_TEXT.fullmatch(c):
            kind = "float"
        elif not _INT_TEXT.fullmatch(c):
            return "object"
    return kind


def as_pandas_writes(files: list[list[dict[str, str]]], header: tuple[str, ...]) -> list[list[dict[str, str]]]:
    """Each file's rows as AITER's merge writes them (read_csv, concat, to_csv: core.py:280-400): NA cells blank,
    integers re-printed, and a column that is float in one file (a blank in an integer column) and numeric in
    all is float everywhere: 128 -> 128.0. A loader that int()s cells (TableFamily.loader_ints) fails on them."""
    live = [rows for rows in files if rows]  # empty frames stay out of the concat
    out = [[dict(r) for r in rows] for rows in files]
    for col in header:
        kinds = [_dtype([r[col] for r in rows]) for rows in live]
        merged_float = "float" in kinds and "object" not in kinds
        for rows, kind in zip([o for o in out if o], kinds):
            as_float = kind == "float" or (merged_float and kind == "int")
            for r in rows:
                c = r[col]
                if c in _NA:
                    r[col] = ""
                elif as_float:
                    r[col] = repr(float(c))
                elif kind == "int" and not (c.isascii() and c.isdecimal() and (c[0] != "0" or len(c) == 1)):
                    r[col] = str(int(c))  # a sign, a leading zero or a non-ASCII digit: pandas prints it plainly
    return out


@dataclass
class MergeResult:
    table: Table | None
    error: str | None = None  # what AITER raises
    rewritten: list[str] = field(default_factory=list)  # files AITER rewrites in place before raising


def aiter_merge(release: AiterRelease, family: TableFamily, untuned_header: tuple[str, ...] | None,
                tables: list[Table], live_gfx: str) -> MergeResult:
    """What the release's update_config_files makes of these existing files, in path order."""
    lead = next((t for t in tables if t.preamble), None)
    if lead is not None:  # pd.read_csv(path) (core.py:280) takes the first comment line for the header
        return MergeResult(None, f"pandas reads {lead.name}'s first line {lead.preamble[0][:60]!r} as its header: "
                                 "AITER's merge of this file is not the table")
    if release.merge_union_columns:
        header = union_header(tables)
    else:
        header = tables[0].header
        for t in tables[1:]:
            if t.header != header:
                return MergeResult(None, f"AssertionError: Column mismatch between {tables[0].name} and {t.name}")
    written = as_pandas_writes([filled_rows(t, header, live_gfx) for t in tables], header)
    rows = [(t.name, r) for t, rs in zip(tables, written) for r in rs]
    if untuned_header is None:  # no untuned sibling: AITER logs a warning and dedups nothing
        return MergeResult(Table(header, [r for _, r in rows], "merged"))
    keys = release.merge_key(untuned_header, header)
    if release.merge_on_duplicate == "lowest_us":
        best: dict[tuple, dict[str, str]] = {}
        for _, r in sorted(rows, key=lambda x: _us(x[1])):
            best.setdefault(row_key(keys, r), r)
        return MergeResult(Table(header, list(best.values()), "merged"))
    seen: dict[tuple, int] = {}
    for _, r in rows:
        k = row_key(keys, r)
        seen[k] = seen.get(k, 0) + 1
    dups = [(name, r) for name, r in rows if seen[row_key(keys, r)] > 1]
    if not dups:
        return MergeResult(Table(header, [r for _, r in rows], "merged"))
    if "us" not in header:
        return MergeResult(None, f"RuntimeError: Found {len(dups)} duplicate shape entries during merge of "
                                 f"'{family.merge_name}'. No 'us' column")
    best_of: dict[tuple, int] = {}
    for i, (_, r) in sorted(enumerate(rows), key=lambda x: _us(x[1][1])):
        best_of.setdefault(row_key(keys, r), i)
    winners = set(best_of.values())
    losers = sorted({rows[i][0] for i in range(len(rows)) if i not in winners})
    first = row_key(keys, dups[0][1])
    where = sorted({name for name, r in dups if row_key(keys, r) == first})
    return MergeResult(None, f"RuntimeError: Found {len(dups)} duplicate shape entries during merge of "
                             f"'{family.merge_name}', first {','.join(f'{k}={dups[0][1][k]}' for k in keys)} in "
                             f"{' and '.join(where)}; AITER rewrote {', '.join(losers)} in place first", losers)


def merge(release: AiterRelease, family: TableFamily, untuned_header: tuple[str, ...], tables: list[Table],
          live_gfx: str) -> Table:
    """One table with unique merge keys, filled as AITER fills a merge. AITER's rule: lowest us wins, ties to
    the earlier file; rows keep the position of the first row of their key."""
    header = union_header(tables)
    keys = release.merge_key(untuned_header, header)
    best: dict[tuple, tuple[int, dict[str, str]]] = {}
    order = 0
    for t in tables:
        for full in filled_rows(t, header, live_gfx):
            k = row_key(keys, full)
            old = best.get(k)
            if old is None:
                best[k] = (order, full)
                order += 1
            elif _us(full) < _us(old[1]):
                best[k] = (old[0], full)
    return Table(header, [r for _, r in sorted(best.values(), key=lambda x: x[0])], "merged")
