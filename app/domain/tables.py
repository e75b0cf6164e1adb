"""Reading, writing and merging AITER CSV tables the way AITER does (aiter/jit/core.py:266-401)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from collections import Counter
from dataclasses import dataclass, field

from app.domain.families import AiterRelease, TableFamily, gfx_from_cu_num
from app.domain.headers import parse_header_line
from app.domain.keys import Key, row_key
from app.domain.row_memo import NO_MEMO, RowMemo


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


def rows_digest(table: Table, memo: RowMemo = NO_MEMO) -> str:
    """A digest of the table's header and rows, cell by cell (what a lookup on it can depend on): the bytes of
    json.dumps([header, rows]), each row's part kept in memo."""
    rows = ", ".join(memo.per_row("json", table.rows, lambda r: json.dumps(r, default=str)))
    text = f"[{json.dumps(table.header, default=str)}, [{rows}]]"
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


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


def filled_rows(t: Table, header: tuple[str, ...], live_gfx: str, memo: RowMemo = NO_MEMO
                ) -> list[dict[str, str]]:
    """A table's rows in the merged header, cells it lacks filled as AITER fills them: gfx from cu_num
    (gfx_from_cu_num), every other column 0 (core.py:297-308); _tag NaN reads as '' (:315-317)."""
    return memo.rows(("filled", header, live_gfx), (t,), lambda: _filled(t, header, live_gfx))


def _filled(t: Table, header: tuple[str, ...], live_gfx: str) -> list[dict[str, str]]:
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


def as_pandas_writes(files: list[list[dict[str, str]]], header: tuple[str, ...], memo: RowMemo = NO_MEMO
                     ) -> list[list[dict[str, str]]]:
    """Each file's rows as AITER's merge writes them (read_csv, concat, to_csv: core.py:280-400): NA cells blank,
    integers re-printed, and a column that is float in one file (a blank in an integer column) and numeric in
    all is float everywhere: 128 -> 128.0. A loader that int()s cells (TableFamily.loader_ints) fails on them.
    memo: each file's column dtypes and written rows, kept for the files it holds."""
    live = [rows for rows in files if rows]  # empty frames stay out of the concat
    # a lambda's default arguments bind this loop's rows and column (mypy cannot infer such a lambda: misc)
    kinds = [[memo.value(("dtype", col), (rows,),
                         lambda rows=rows, col=col: _dtype([r[col] for r in rows]))  # type: ignore[misc]
              for col in header] for rows in live]
    merged_float = [all(k[j] != "object" for k in kinds) and any(k[j] == "float" for k in kinds)
                    for j in range(len(header))]
    written = []
    for rows, ks in zip(live, kinds):
        plan = tuple((col, k, k == "float" or (mf and k == "int")) for col, k, mf in zip(header, ks, merged_float))
        written.append(memo.rows(("written", plan), (rows,),
                                 lambda rows=rows, plan=plan: _written(rows, plan)))  # type: ignore[misc]  # as above
    out = iter(written)
    return [next(out) if rows else [] for rows in files]


def _written(rows: list[dict[str, str]], plan: tuple[tuple[str, str, bool], ...]) -> list[dict[str, str]]:
    """One file's rows as written; plan: (column, its dtype in this file, written as float) per column."""
    out = [dict(r) for r in rows]
    for col, kind, as_float in plan:
        for r in out:
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
                tables: list[Table], live_gfx: str, memo: RowMemo = NO_MEMO) -> MergeResult:
    """What the release's update_config_files makes of these existing files, in path order (core.py:266-401):
    the files' rows filled and concatenated; a key repeated across them (the untuned header + cu_num, gfx,
    _tag: :320-338) raises after rewriting each file that lost a row to the globally lowest us per key
    (a stable sort by us, :340-377). memo: what is made of the files it holds, kept (row_memo)."""
    lead = next((t for t in tables if t.preamble), None)
    if lead is not None:  # pd.read_csv(path) (core.py:280) takes the first comment line for the header
        return MergeResult(None, f"pandas reads {lead.name}'s first line {lead.preamble[0][:60]!r} as its header: "
                                 "AITER's merge of this file is not the table")
    header = _merge_header(release, tables)
    if isinstance(header, MergeResult):
        return header
    written = as_pandas_writes([filled_rows(t, header, live_gfx, memo) for t in tables], header, memo)
    rows = [r for rs in written for r in rs]
    if untuned_header is None:  # no untuned sibling: AITER logs a warning and dedups nothing
        return MergeResult(Table(header, rows, "merged"))
    keys = release.merge_key(untuned_header, header)
    ks = [k for rs in written for k in memo.per_row(("key", keys), rs, lambda r: row_key(keys, r))]
    if release.merge_on_duplicate == "lowest_us":
        return MergeResult(Table(header, _lowest_us(written, rows, ks, memo), "merged"))
    seen = Counter(ks)
    dups = [i for i, k in enumerate(ks) if seen[k] > 1]
    if not dups:
        return MergeResult(Table(header, rows, "merged"))
    if "us" not in header:
        return MergeResult(None, f"RuntimeError: Found {len(dups)} duplicate shape entries during merge of "
                                 f"'{family.merge_name}'. No 'us' column")
    return _duplicates_raise(family, [t.name for t, rs in zip(tables, written) for _ in rs], rows, ks, dups, keys)


def _lowest_us(written: list[list[dict[str, str]]], rows: list[dict[str, str]], ks: list[Key],
               memo: RowMemo) -> list[dict[str, str]]:
    """Releases that keep a key's fastest row: sorted by us (stable), the first row of each key kept."""
    us = [u for rs in written for u in memo.per_row("us", rs, _us)]
    best: dict[Key, dict[str, str]] = {}
    for i in sorted(range(len(rows)), key=us.__getitem__):
        best.setdefault(ks[i], rows[i])
    return list(best.values())


def _merge_header(release: AiterRelease, tables: list[Table]) -> tuple[str, ...] | MergeResult:
    """The merged table's header: the files' union (releases that merge by union), else the first file's, which
    every other file must repeat (AITER asserts it), or the MergeResult of that assertion."""
    if release.merge_union_columns:
        return union_header(tables)
    header = tables[0].header
    for t in tables[1:]:
        if t.header != header:
            return MergeResult(None, f"AssertionError: Column mismatch between {tables[0].name} and {t.name}")
    return header


def _duplicates_raise(family: TableFamily, name: list[str], rows: list[dict[str, str]], ks: list[Key],
                      dups: list[int], keys: tuple[str, ...]) -> MergeResult:
    """AITER's RuntimeError for keys repeated across files (name: each row's file), after it rewrote in place each
    file that lost a row to its key's lowest us."""
    # the first row of each key in a stable sort by us: the lowest (us, position); a key's only row is its own
    best_of: dict[Key, int] = {}
    for i in dups:
        j = best_of.get(ks[i])
        if j is None or _us(rows[i]) < _us(rows[j]):
            best_of[ks[i]] = i
    losers = sorted({name[i] for i in dups if best_of[ks[i]] != i})
    first = ks[dups[0]]
    where = sorted({name[i] for i in dups if ks[i] == first})
    return MergeResult(None, f"RuntimeError: Found {len(dups)} duplicate shape entries during merge of "
                             f"'{family.merge_name}', first {','.join(f'{k}={rows[dups[0]][k]}' for k in keys)} in "
                             f"{' and '.join(where)}; AITER rewrote {', '.join(losers)} in place first", losers)


def merge(release: AiterRelease, family: TableFamily, untuned_header: tuple[str, ...], tables: list[Table],
          live_gfx: str, memo: RowMemo = NO_MEMO) -> Table:
    """One table with unique merge keys, filled as AITER fills a merge. AITER's rule: lowest us wins, ties to
    the earlier file; rows keep the position of the first row of their key."""
    header = union_header(tables)
    keys = release.merge_key(untuned_header, header)
    best: dict[Key, tuple[int, dict[str, str]]] = {}
    order = 0
    for t in tables:
        filled = filled_rows(t, header, live_gfx, memo)
        for full, k in zip(filled, memo.per_row(("key", keys), filled, lambda r: row_key(keys, r))):
            old = best.get(k)
            if old is None:
                best[k] = (order, full)
                order += 1
            elif _us(full) < _us(old[1]):
                best[k] = (old[0], full)
    return Table(header, [r for _, r in sorted(best.values(), key=lambda x: x[0])], "merged")
