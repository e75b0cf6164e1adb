"""Will AITER use the table? Rebuild the run-time key for each captured shape and look it up the way the
image's AITER release loads and reads the table it builds from what is deployed (see deploy.build)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from app.domain.families import GPU_FP8, TableFamily, WeightRetry, gfx_from_cu_num, gpu_fp8
from app.domain.keys import cpp_m_candidates, lookup_keys, moe_token, row_key
from app.domain.row_memo import NO_MEMO, RowMemo
from app.domain.tables import Table

Key = tuple[object, ...]  # a lookup key (keys.row_key)
Shape = dict[str, str]
Row = dict[str, str]


@dataclass
class ShapeEngagement:
    shape: dict[str, str]
    hit: bool
    tried_m: list[int | None]
    matched_m: int | None = None
    row: dict[str, str] | None = None
    reason: str = ""
    fails: bool = False  # AITER raises on this shape: running the row's kernel, or on its default path
    # what the verdict depends on that a capture does not carry (the op reads it from its arguments): set, the
    # verdict is "unknown" (issue 35)
    unknown: str | None = None

    @property
    def verdict(self) -> str:
        """hit (a row AITER runs), raises (the call raises: the server would crash on it), miss (a default) or
        unknown (it depends on what the capture does not carry: the reason says what)."""
        return "unknown" if self.unknown else "hit" if self.hit else "raises" if self.fails else "miss"


# the cells that tell one row of a table from another when the key is the same (what a proof compares)
ROW_IDENTITY = ("kernelName", "kernelName1", "kernelName2", "kernelId", "splitK", "libtype", "us", "BV")


def _norm(v: object) -> object:
    if v is None or v != v or v == "":  # pandas reads an empty cell as NaN
        return ""
    try:
        return float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(v)


def same_row(theirs: Mapping[str, object], ours: Mapping[str, object]) -> bool:
    """The row AITER picked (as its loader read it: numbers parsed) is ours: equal in the ROW_IDENTITY cells
    both have."""
    return all(_norm(theirs.get(c)) == _norm(ours.get(c)) for c in ROW_IDENTITY if c in theirs and c in ours)


def row_identity(row: Mapping[str, object] | None) -> dict[str, str] | None:
    """What a proof posts of the row AITER picked: its ROW_IDENTITY cells, as text."""
    return None if row is None else {c: "" if _norm(row[c]) == "" else str(row[c]) for c in ROW_IDENTITY
                                     if c in row}


class LookupRaises(Exception):
    """AITER's loader raises on this table (a repeated key where the lookup needs a unique index)."""


def _m_at(family: TableFamily, keys: tuple[str, ...]) -> int | None:
    return keys.index(family.m_column) if family.m_column in keys else None


def _rest(key: Key, mi: int | None) -> Key:
    """A lookup key less its M cell (all of it where the key has none)."""
    return key if mi is None else key[:mi] + key[mi + 1:]


def _by_rest(family: TableFamily, keys: tuple[str, ...], index: dict[Key, Row]) -> dict[Key, list[object]]:
    """The index's keys grouped by their cells besides M, in index order, with their Ms: what a miss is
    explained from (_miss_reason) without reading every row for each shape that misses."""
    mi = _m_at(family, keys)
    out: dict[Key, list[object]] = {}
    for k in index:
        out.setdefault(_rest(k, mi), []).append(None if mi is None else k[mi])
    return out


def _miss_reason(family: TableFamily, keys: tuple[str, ...], want: Key, tried: list[int | None],
                 by_rest: dict[Key, list[object]], closest: dict[Key, str]) -> str:
    """closest: the closest-row reasons made so far in this check, by the key's cells besides M."""
    if not by_rest:
        return "the table has no rows"
    mcol, mi = family.m_column, _m_at(family, keys)
    rest = _rest(want, mi)
    if mi is not None and rest in by_rest:
        near = sorted(set(by_rest[rest]), key=lambda v: (v is None, v if isinstance(v, int) else 0))
        return (f"rows exist for this shape only at {mcol}={near}; AITER looks up {mcol} in {tried} "
                f"(raw, then padded)")
    if rest not in closest:
        names = [c for i, c in enumerate(keys) if i != mi]
        best, best_diff = None, None
        for r in by_rest:  # the first row (in index order) differing in the fewest cells besides M
            diff = [j for j, (a, b) in enumerate(zip(r, rest)) if a != b]
            if best_diff is None or len(diff) < len(best_diff):
                best, best_diff = r, diff
        assert best is not None and best_diff is not None
        parts = [f"{names[j]}: table has {best[j]!r}, runtime uses {rest[j]!r}" for j in best_diff]
        closest[rest] = "closest row differs in " + "; ".join(parts) if parts else "no row at any M tried"
    return closest[rest]


def _written_as_comment(first_cell: str, prefix: str) -> bool:
    """The CSV line a row is written as starts with prefix (after blanks); a quoted first cell starts with '"'."""
    return first_cell.lstrip().startswith(prefix) and not any(ch in first_cell for ch in ',"\r\n')


def loaded_rows(family: TableFamily, table: Table, live_gfx: str) -> list[dict[str, str]]:
    """The rows as the family's loader keeps them: comment lines and dropped tags out, gfx backfilled from
    cu_num."""
    rows = table.rows
    if family.comment_prefix is not None and table.header:
        first, prefix = table.header[0], family.comment_prefix
        rows = [r for r in rows if not _written_as_comment(str(r.get(first, "")), prefix)]
    if family.dropped_rows:
        rows = [r for r in rows if not any(str(r.get(c, "")) == v for c, v in family.dropped_rows)]
    if family.backfill_gfx:  # fused_moe.py _ensure_gfx_column: missing, 0, '' or nan
        rows = [r if str(r.get("gfx", "")) not in ("", "0", "nan", "None") else
                dict(r, gfx=gfx_from_cu_num(r.get("cu_num", ""), live_gfx)) for r in rows]
    return rows


def loader_error(family: TableFamily, rows: list[dict[str, str]]) -> str | None:
    """What makes a loader that int()s cells (TableFamily.loader_ints) keep no row at all, if anything."""
    for i, r in enumerate(rows):
        for col, blank_ok in family.loader_ints:
            cell = r.get(col)
            if cell is None:
                return f"KeyError: the table has no {col} column"
            if blank_ok and not cell.strip():
                continue
            try:
                int(cell)
            except ValueError:
                return f"ValueError: int({cell!r}) of {col} in row {i + 1}"
    return None


def lookup_columns(family: TableFamily, key_columns: tuple[str, ...]) -> tuple[str, ...]:
    """The columns the run-time lookup keys on: less the ones it wildcards; gfx even where the table has none,
    when the loader backfills it from cu_num (fused_moe.py _ensure_gfx_column)."""
    if family.backfill_gfx and "gfx" in family.key_columns and "gfx" not in key_columns:
        key_columns = ("gfx",) + key_columns
    return tuple(c for c in key_columns if c not in family.lookup_ignores)


def lookup_index(family: TableFamily, key_columns: tuple[str, ...], rows: list[dict[str, str]],
                 memo: RowMemo = NO_MEMO) -> dict[Key, Row]:
    """memo: each row's key (and whole row), kept for the rows it holds."""
    index: dict[Key, Row] = {}
    ks = memo.per_row(("key", key_columns), rows, lambda r: row_key(key_columns, r))
    if family.duplicate_keys in ("raise", "raise_any"):
        # drop_duplicates() removes only rows identical in every cell, then set_index().to_dict('index')
        # raises on a repeated key (tuned_gemm.py:87-101, gemm_op_a8w8.py:509-525); "raise_any" drops nothing.
        # A row identical to an earlier one has its key, and the one row kept at that key is that earlier one.
        drop = family.duplicate_keys == "raise"
        for r, k in zip(rows, ks):
            old = index.get(k)
            if old is not None:
                if drop and old == r:
                    continue
                raise LookupRaises(f"ValueError: DataFrame index must be unique (key {k} repeats)")
            index[k] = r
        return index
    for r, k in zip(rows, ks):
        index.setdefault(k, r)
    return index


@dataclass
class Lookup:
    """A table as the family's loader keeps it, indexed the way its run-time lookup reads it (prepare): the
    part of check that costs in proportion to the table, made once per table and reused for any shapes."""
    key_columns: tuple[str, ...]  # the columns the lookup keys on (lookup_columns)
    rows: list[dict[str, str]]
    index: dict[Key, Row] | None = None  # lookup key: row (None: a wildcard family, or nothing is looked up)
    cpp: dict[Key, Row] | None = None  # the compiled table's (_cpp_index)
    by_rest: dict[Key, list[object]] = field(default_factory=dict)  # _by_rest of index
    misses: str | None = None  # why every shape misses (a key column missing, a loader that reads no row)
    tried_on: tuple[str, ...] = ()  # the key columns the M candidates of a shape that misses are listed on
    raises: str | None = None  # LookupRaises: AITER's loader raises on this table


def prepare(family: TableFamily, key_columns: tuple[str, ...], gfx: str, table: Table,
            cpp_targets: tuple[tuple[str, int], ...], memo: RowMemo = NO_MEMO) -> Lookup:
    """The table as AITER's lookup reads it on gfx; cpp_targets: the (gfx, cu_num) rows its compiled table is
    built from (see check). memo: what is made of each row it holds, kept (deploy.Shipped.memo)."""
    missing = [c for c in key_columns if c not in table.header and not (c == "gfx" and family.backfill_gfx)]
    if missing:  # AITER's set_index raises, or keys on something else: nothing in it engages
        return Lookup(key_columns, [], tried_on=key_columns, misses=(
            f"the table's header lacks key column(s) {', '.join(missing)} that this image's AITER indexes on; "
            f"header is {','.join(table.header)}"))
    key_columns = lookup_columns(family, key_columns)
    rows = loaded_rows(family, table, gfx)
    bad = loader_error(family, rows)
    if bad:  # linear_attention_prefill_kernels.py:704-705: the loader returns no rows
        return Lookup(key_columns, rows, tried_on=key_columns, misses=(
            f"AITER's loader reads no row of this table ({bad}); every shape takes its default"))
    if family.key_match == "wildcard":
        return Lookup(key_columns, rows)
    try:
        index = lookup_index(family, key_columns, rows, memo)
    except LookupRaises as e:
        return Lookup(key_columns, rows, raises=str(e))
    return Lookup(key_columns, rows, index, _cpp_index(family, cpp_targets, rows, memo),
                  by_rest=_by_rest(family, key_columns, index))


@dataclass(frozen=True)
class Ask:
    """One check's arguments, its table prepared (Lookup): what every rule of the chain reads. gfx, cu_num: what
    the Python lookup keys on; cpp_at: the device (its gfx is where the op's remaps and branches run); arch: what
    get_gfx() answers; env: the serving environment a capture carried. closest: _miss_reason's memo."""
    family: TableFamily
    lk: Lookup
    gfx: str
    cu_num: int
    cpp_at: tuple[str, int]
    flydsl: bool = True
    arch: str | None = None
    env: dict[str, str] | None = None
    closest: dict[Key, str] = field(default_factory=dict)

    @property
    def device(self) -> str:
        return self.cpp_at[0]

    @property
    def index(self) -> dict[Key, dict[str, str]]:
        assert self.lk.index is not None  # the chain runs on an exact-key lookup only (check)
        return self.lk.index

    def again(self, shape: Shape) -> ShapeEngagement:
        """This check, of one shape (the padded-weight retry, a call a capture cannot tell)."""
        return _verdicts(replace(self, closest={}), [shape])[0]


def check(family: TableFamily, key_columns: tuple[str, ...], gfx: str, cu_num: int,
          shapes: list[dict[str, str]], table: Table, flydsl: bool = True,
          cpp_at: tuple[str, int] | None = None,
          build_targets: tuple[tuple[str, int], ...] | None = None,
          prepared: Lookup | None = None, arch: str | None = None,
          env: dict[str, str] | None = None) -> list[ShapeEngagement]:
    """Per captured shape, whether AITER's lookup finds a row it uses. (gfx, cu_num): what the Python lookup keys
    on; cpp_at: the device the compiled table is asked for (default the same); build_targets: the (gfx, cu_num)
    rows it is built from (default cpp_at) - see families.lookup_identity. prepared: prepare() of these
    arguments, made earlier. arch: what get_gfx() answers (families.LookupIdentity.arch), which a MoE op's
    branches read (default the device's gfx). env: the serving environment a capture carried (the variables a MoE
    op reads, with_env). Raises LookupRaises where the loader itself would raise on the table. Each shape runs
    SHAPE_RULES (the first that answers is its verdict), then PASSES run over every verdict, in order."""
    cpp_at = cpp_at or (gfx, cu_num)
    lk = prepared or prepare(family, key_columns, gfx, table, build_targets or (cpp_at,))
    if lk.raises is not None:
        raise LookupRaises(lk.raises)
    c = Ask(family, lk, gfx, cu_num, cpp_at, flydsl, arch, env)
    if lk.misses is not None:  # nothing in the table engages: the op's own paths still decide
        out = [ShapeEngagement(s, False, [m for m, _ in lookup_keys(family, lk.tried_on, gfx, cu_num, s)],
                               reason=lk.misses) for s in shapes]
        return _op_paths(c, _default_stages_wrapped(c, out))
    if lk.index is None:  # family.key_match == "wildcard"
        return [_wildcard(family, lk.key_columns, gfx, cu_num, raw, lk.rows) for raw in shapes]
    return _verdicts(c, shapes)


def _verdicts(c: Ask, shapes: list[Shape]) -> list[ShapeEngagement]:
    out = [_shape_verdict(c, raw) for raw in shapes]
    for rule in PASSES:
        out = rule(c, out)
    return out


def _shape_verdict(c: Ask, raw: Shape) -> ShapeEngagement:
    shape = c.family.looked_up(with_env(c.family, raw, c.env), c.device, c.arch)  # remaps run on the device's gfx
    return next(res for rule in SHAPE_RULES if (res := rule(c, raw, shape)) is not None)


# --- SHAPE_RULES: (ask, the shape as captured, as the op hands it to its lookup) -> its verdict, or None: the next

def _op_refuses(c: Ask, raw: Shape, shape: Shape) -> ShapeEngagement | None:
    """The MoE op raises before it looks anything up (MoeOpPath.raises; e.g. fused_moe.py:861-880, the a16w4
    SiTUv2 refusals before get_2stage_cfgs at :882)."""
    op = c.family.moe_op
    refused = op.refuses(shape, c.device, c.flydsl, c.arch) if op else None
    if refused is None:
        return None
    return ShapeEngagement(raw, False, [], reason=f"AITER raises on this call ({refused.where}: {refused.reason})",
                           fails=True)


def _looked_up_elsewhere(c: Ask, raw: Shape, shape: Shape) -> ShapeEngagement | None:
    """A MoE call whose lookup reads another table (MoeOpPath.table_when / other_table; fhmoe.py:569-586:
    AITER_CONFIG_FHMOE for the DSV4 I384 contract only, else tuned_fmoe)."""
    op = c.family.moe_op
    if op is None or op.reads_table(shape, c.device, c.arch):
        return None
    # a capture of this family is a lookup of its table (its log line): such a call is one a list posted
    # by hand holds, or one a capture cannot tell from it (a shared-expert call); what runs it (that
    # table's row or default, then the op's stage check) depends on that table: unknown (issue 35)
    why = f"the op looks this call up in another table ({op.where}), not this one"
    return ShapeEngagement(raw, False, [], reason=f"unknown: depends on {why}", unknown=why)


def _tier_uncovered(c: Ask, raw: Shape, shape: Shape) -> ShapeEngagement | None:
    """Before its own lookup the op asks for a row it runs at every padded token tier up to the call's
    (MoeOpPath.tiers_cover, fhmoe.py:345-385,579-583): one lacking raises."""
    lacking = _tier_lacking(c, shape)
    if lacking is None:
        return None
    assert c.family.moe_op is not None and c.family.moe_op.tiers_cover is not None
    cover = c.family.moe_op.tiers_cover
    return ShapeEngagement(raw, False, [lacking], reason=f"AITER raises on this call ({cover.where}: {cover.reason}): "
                           f"no row it runs at {c.family.m_column}={lacking}", fails=True)


def _looked_up(c: Ask, raw: Shape, shape: Shape) -> ShapeEngagement:
    """The lookup itself: the key at each M candidate in AITER's order (raw, then padded: tuned_gemm.py:145-162,
    fused_moe.py:882 get_padded_M), the first row found put through ROW_RULES; none: _no_row."""
    cands = lookup_keys(c.family, c.lk.key_columns, c.gfx, c.cu_num, shape)
    found = Found(raw, shape, [m for m, _ in cands])
    skipped: list[int | None] = []
    for m, k in cands:
        row = c.index.get(k)
        if row is None:
            continue
        res = next(r for rule in ROW_RULES if (r := rule(c, found, m, row)) is not None)
        if isinstance(res, ShapeEngagement):
            return res
        skipped.append(m)  # NEXT: the lookup goes on to the next candidate
    return _no_row(c, found, cands[0][1], skipped)


SHAPE_RULES: tuple[Callable[[Ask, Shape, Shape], ShapeEngagement | None], ...] = (
    _op_refuses, _looked_up_elsewhere, _tier_uncovered, _looked_up)


# --- ROW_RULES: (ask, the call, its M tried, the row found there) -> its verdict, NEXT (look at the next M), or
# None: the next rule

NEXT: Final = "next"


@dataclass(frozen=True)
class Found:
    """A call being looked up: as captured (raw), as the op hands it to the lookup (shape), the Ms it tries."""
    raw: Shape
    shape: Shape
    tried: list[int | None]

    def verdict(self, m: int | None, row: dict[str, str], reason: str = "", fails: bool = False,
                hit: bool = False) -> ShapeEngagement:
        return ShapeEngagement(self.raw, hit, self.tried, m, row, reason=reason, fails=fails)


def _flydsl_absent(c: Ask, f: Found, m: int | None, row: dict[str, str]) -> ShapeEngagement | Literal["next"] | None:
    """A FlyDSL row where flydsl is not importable, or its kernel not in the catalog (family.flydsl_miss):
    bf16's lookup goes on to the next padded M (tuned_gemm.py:163-177, gemm_kernels.py:579-586), other ops run
    their default or raise in the MoE stage. The op's libtype dispatch or MoE routes decide where they say."""
    fam = c.family
    # bf16's lookup tells a FlyDSL row by its libtype alone (tuned_gemm.py:163), other families by names too
    fly = row.get("libtype") == "flydsl" if fam.flydsl_catalog else is_flydsl_row(row)
    if (not fly or (c.flydsl and fam.flydsl_known(row)) or fam.flydsl_miss == "ignored" or fam.other_op(f.shape)
            or (fam.moe_op and fam.moe_op.routes)):  # the op's routes say what runs
        return None
    if fam.flydsl_miss == "skip":
        return NEXT
    if fam.flydsl_miss == "default":
        return f.verdict(m, row, "FlyDSL row, but flydsl is not importable in the serving image: the op falls back "
                                 "to its default kernel")
    return f.verdict(m, row, "FlyDSL row, but flydsl is not importable in the serving image: AITER has no fallback "
                             "and raises in the MoE stage", fails=True)


def _row_unreadable(c: Ask, f: Found, m: int | None, row: dict[str, str]) -> ShapeEngagement | None:
    """A shipped row the op cannot parse (family.read_cells: e.g. tuned_gemm.py:327 solMap[libtype],
    ops/gemm_op_a8w8.py:738 int(splitK)) raises when it runs; a posted one is refused."""
    bad = c.family.unreadable(row)
    if bad is None:
        return None
    return f.verdict(m, row, f"AITER raises reading the row's {bad[0]}: {bad[1]}", fails=True)


def _moe_route(c: Ask, f: Found, m: int | None, row: dict[str, str]) -> ShapeEngagement | None:
    """The MoE op's stage choice for the row found (MoeOpPath.routes: get_2stage_cfgs after its 'using' line,
    fused_moe.py:2461-2480 on): a route that runs its own kernels, or launchers that do not run the row's."""
    op = c.family.moe_op
    if op is None or not op.routes:
        return None
    use, why = op.row_use(f.shape, row, c.device, c.flydsl, c.arch)
    return None if use == "hit" else f.verdict(m, row, why, fails=use == "fails")


def _libtype_unrun(c: Ask, f: Found, m: int | None, row: dict[str, str]) -> ShapeEngagement | None:
    """The op's libtype dispatch (family.libtype_use: tuned_gemm.py:325-327 solMap[libtype], ops/gemm_op_a8w8.py
    :749-753): a libtype it does not run falls back to its default kernel, or raises."""
    use = row_use(c.family, f.shape, row)
    if use == "hit":
        return None
    return f.verdict(m, row, f"the op does not run a {row.get('libtype')!r} row: it "
                     + ("raises" if use == "fails" else "falls back to its default kernel"), fails=use == "fails")


def _runs_row(c: Ask, f: Found, m: int | None, row: dict[str, str]) -> ShapeEngagement:
    """A hit, unless the compiled C++ table (chip_info.py:200 build_tune_dict) runs another row's kernel for it
    (_check_cpp)."""
    res = f.verdict(m, row, hit=True)
    if c.lk.cpp is not None:
        _check_cpp(c.family, c.lk.cpp, c.cpp_at[0], c.cpp_at[1], res)
    return res


ROW_RULES: tuple[Callable[[Ask, Found, int | None, dict[str, str]], ShapeEngagement | Literal["next"] | None],
                 ...] = (_flydsl_absent, _row_unreadable, _moe_route, _libtype_unrun, _runs_row)


def _no_row(c: Ask, f: Found, first_key: Key, skipped: list[int | None]) -> ShapeEngagement:
    """No row at any M: the closest row says why (_miss_reason); a default path that raises (family.miss_raises,
    e.g. fused_moe.py:2369-2374) makes it a raise."""
    fam = c.family
    reason = _miss_reason(fam, c.lk.key_columns, first_key, f.tried, c.lk.by_rest, c.closest)
    if skipped:
        reason = (f"FlyDSL rows at {fam.m_column}={skipped} are skipped (flydsl is not importable in the serving "
                  f"image, or the kernel is not in its catalog); " + reason)
    res = ShapeEngagement(f.raw, False, f.tried, reason=reason)
    raising = next((r for r in fam.miss_raises if r.raises(dict(f.shape, gfx=c.gfx))), None)
    if raising is not None:
        res.fails, res.reason = True, f"AITER raises on a shape without a row ({raising.where}: {raising.reason}): " \
                                      + reason
    return res


# --- PASSES: (ask, every shape's verdict) -> the verdicts, in order; each may change any verdict

def _padded_weight_retry(c: Ask, out: list[ShapeEngagement]) -> list[ShapeEngagement]:
    """gemm_a8w8_bpreshuffle (ops/gemm_op_a8w8.py:711-742, family.weight_retry): a weight smaller than the activation
    in K raises before the lookup; a miss at the activation's K is looked up again at a padded weight's K, whose row
    runs. A shape without the weight's K (a capture's: AITER logs the first lookup) is unknown where a row at a
    larger K could be what the retry finds."""
    wr = c.family.weight_retry
    if wr is None or c.lk.index is None:
        return out
    at = c.lk.key_columns.index(wr.column)
    larger: dict[Key, list[int]] = {}  # the index's keys less K: the Ks rows exist at
    for k in c.lk.index:
        if str(k[at]).isdigit():
            larger.setdefault(k[:at] + k[at + 1:], []).append(int(str(k[at])))
    return [_weight_retried(c, wr, larger, res)
            if wr.applies(res.shape) and str(res.shape.get(wr.column, "")).isdigit() else res for res in out]


def _weight_retried(c: Ask, wr: WeightRetry, larger: dict[Key, list[int]], res: ShapeEngagement) -> ShapeEngagement:
    """_padded_weight_retry of one verdict whose shape has the activation's K."""
    col = wr.column
    own, w = int(res.shape[col]), wr.weight(res.shape)
    if w is not None and w < own:
        return ShapeEngagement(res.shape, False, res.tried_m, fails=True,
                               reason=f"AITER raises on this call ({wr.where}: {wr.raises})")
    if res.hit or res.fails or res.row is not None or w == own:
        return res
    if w is not None:  # larger: the retry's own verdict
        got = c.again({**res.shape, col: str(w)})
        got.shape, got.reason = res.shape, (f"no row at {col}={own}; AITER looks the weight's {col}={w} up "
                                            f"({wr.where})" + (f": {got.reason}" if got.reason else ""))
        return got
    at = c.lk.key_columns.index(col)
    rest = [k for _, k in lookup_keys(c.family, c.lk.key_columns, c.gfx, c.cu_num, res.shape)]  # the keys tried
    ks = [x for x in sorted({x for r in rest for x in larger.get(r[:at] + r[at + 1:], []) if x > own})
          if c.again({**res.shape, col: str(x)}).hit]  # the retry would run a row there
    if ks:
        res.unknown = (f"depends on the weight's {col} (the capture has the activation's, {own}): a weight padded "
                       f"to {col}={ks} is looked up again there and its row runs ({wr.where})")
        res.reason = f"unknown: {res.unknown}; at the activation's {col}: {res.reason}"
    return res


def _default_stages_wrapped(c: Ask, out: list[ShapeEngagement]) -> list[ShapeEngagement]:
    """A shared-expert call without a row still has its default stages put through fhmoe_'s wrapper step, which
    raises unless they are the two FlyDSL stages (fhmoe.py:304-317, :563-613; without FlyDSL they never are):
    MoeOpPath.stages_raise_on_miss. A call looked up in another table (tried_m empty) is not this table's miss."""
    op = c.family.moe_op
    if op is None or not op.stages:
        return out
    for res in out:
        if res.hit or res.fails or res.row is not None or not res.tried_m:
            continue
        why = op.stages_raise_on_miss(c.family.looked_up(with_env(c.family, res.shape, c.env), c.device, c.arch),
                                      c.device, c.flydsl, c.arch)
        if why is not None:
            res.fails, res.reason = True, f"AITER raises on this call ({why}): no row, and " + res.reason
    return out


def _op_paths(c: Ask, out: list[ShapeEngagement]) -> list[ShapeEngagement]:
    """The op's own paths whatever the table holds (family.op_paths, e.g. tuned_gemm.py:371, :427, :561, :601, on
    the device's gfx, with get_gfx()'s answer arch and FlyDSL importable or not): a raise overrides any verdict, a
    default kernel a hit."""
    for res in out:
        path = c.family.op_path(dict(res.shape, flydsl=str(c.flydsl)), res.row, c.device, c.arch)
        if path is None or (path.runs == "default" and not res.hit):
            continue
        res.hit, res.fails = False, path.runs == "raises"
        if res.fails:
            res.unknown = None  # it raises whatever the capture leaves out
        res.reason = (f"AITER raises here ({path.where}: {path.reason})" if res.fails else
                      f"the op runs its default kernel, not the row ({path.where}: {path.reason})")
    return out


def _calls_a_capture_cannot_tell(c: Ask, out: list[ShapeEngagement]) -> list[ShapeEngagement]:
    """A MoE lookup's log line does not say which call made it (MoeOpPath.call_variants: fused_moe, or fused_moe
    with shared experts, which fhmoe_ runs with its own q_dtype_a and its wrapper step on the stages,
    fhmoe.py:563-613; the gate mode): where more than one derives the captured q_dtype_a and their verdicts differ, the
    verdict is unknown, naming them."""
    op = c.family.moe_op
    if op is None or len(op.call_variants) < 2:
        return out
    for res in out:
        if res.unknown:
            continue
        calls = op.variants_for(c.family.remap(with_env(c.family, res.shape, c.env)), c.device, c.arch)
        if len(calls) < 2:
            continue
        got = [(v, c.again({**res.shape, **v})) for v in calls]
        if len({(g.verdict, str(g.row)) for _, g in got}) > 1:
            res.unknown = ("depends on the call, which the capture does not say: " + "; ".join(
                f"{', '.join(f'{k}={x}' for k, x in v.items())}: {g.verdict}" for v, g in got))
            res.reason = f"unknown: {res.unknown}" + (f" (the first: {res.reason})" if res.reason else "")
            res.hit = res.fails = False  # counted as neither
    return out


PASSES: tuple[Callable[[Ask, list[ShapeEngagement]], list[ShapeEngagement]], ...] = (
    _padded_weight_retry, _default_stages_wrapped, _op_paths, _calls_a_capture_cannot_tell)


def with_env(family: TableFamily, shape: dict[str, str], env: dict[str, str] | None) -> dict[str, str]:
    """The call's cells with the serving environment's variables its MoE op reads (MoeOpPath.env: fused_moe.py:76,
    :768, :781-784, :799-800), as the capture's env carries them; one unset keeps its unset value (call_defaults)."""
    if family.moe_op is None or not env:
        return shape
    return dict(shape, **{k: env[k] for k in family.moe_op.env if k in env})


def _tier_lacking(c: Ask, shape: Shape) -> int | None:
    """The first padded token tier up to the call's token (1, 2, 4, ... and its own) the table has no row the op
    runs at, looked up with moe_op.tier_cells (fhmoe.py:345-385); None: every tier covered, or no such check."""
    family, op = c.family, c.family.moe_op
    if op is None or op.tiers_cover is None or family.m_column is None:
        return None
    m = int(shape[family.m_column])
    at = {col: gpu_fp8(c.device) if v == GPU_FP8 else v for col, v in op.tier_cells}
    for t in sorted({moe_token(1 << e) for e in range(m.bit_length())} | {moe_token(m)}):
        cells = dict(shape, **at, **{family.m_column: str(t)})
        row = next((r for _, k in lookup_keys(family, c.lk.key_columns, c.gfx, c.cu_num, cells)
                    if (r := c.index.get(k)) is not None), None)
        if row is None or op.row_use(cells, row, c.device, c.flydsl, c.arch)[0] != "hit":
            return t
    return None


def _wildcard(family: TableFamily, key_columns: tuple[str, ...], gfx: str, cu_num: int, raw: dict[str, str],
              rows: list[dict[str, str]]) -> ShapeEngagement:
    """grouped_moe_gfx1250.py _find_grouped_config: every key cell a row fills (stripped) must equal the call's,
    an empty or absent cell matches anything; no match with cu_num, then without it; the lowest us wins (a stable
    sort: ties keep file order)."""
    (m, _), = lookup_keys(family, key_columns, gfx, cu_num, raw)[:1]
    op = family.moe_op
    gone = op.declined(family.remap(raw), gfx) if op else None
    if gone is not None:  # the entry hands the call back to the generic MoE before its lookup
        return ShapeEngagement(raw, False, [m], reason=f"{gone.reason} ({gone.where}); the generic MoE runs it")
    want = dict(family.remap(raw), gfx=gfx, cu_num=str(cu_num))
    if m is not None:
        want[family.m_column] = str(m)  # type: ignore[index]

    def fits(r: dict[str, str], cols: tuple[str, ...]) -> bool:
        return all(not r.get(c) or str(r.get(c)).strip() == want[c] for c in cols)
    for cols in (key_columns, tuple(c for c in key_columns if c != "cu_num")):
        found = [r for r in rows if fits(r, cols)]
        if found:
            row = min(found, key=lambda r: float(r.get("us") or 0.0))
            gone = op.declined(family.remap(raw), gfx, after=True) if op else None
            if gone is not None:
                return ShapeEngagement(raw, False, [m], m, row, reason=f"{gone.reason} ({gone.where})")
            return ShapeEngagement(raw, True, [m], m, row)
    return ShapeEngagement(raw, False, [m], reason="no row matches (empty cells match anything, cu_num dropped "
                                                    "as a last resort)")


def row_use(family: TableFamily, shape: dict[str, str], row: dict[str, str]) -> str:
    """What the op does with the row its lookup returned: "hit", "default" or "fails" (family.libtype_use)."""
    if not family.libtype_use or family.other_op(shape):
        return "hit"
    return dict(family.libtype_use).get(str(row.get("libtype", "")), family.libtype_other)


def _cpp_index(family: TableFamily, targets: tuple[tuple[str, int], ...], rows: list[dict[str, str]],
               memo: RowMemo = NO_MEMO) -> dict[Key, Row] | None:
    """build_tune_dict: rows of the build targets (and the compiled libtype) only, a plain dict, so the last row
    of a key wins."""
    if family.cpp_key is None:
        return None
    cols, cpp_key = ("gfx", "cu_num") if "gfx" in family.cpp_key else ("cu_num",), family.cpp_key  # targets' rows
    wanted = {row_key(cols, {"gfx": g, "cu_num": str(c)}) for g, c in targets}
    index: dict[Key, Row] = {}
    for r, at in zip(rows, memo.per_row(("key", cols), rows, lambda r: row_key(cols, r))):
        if at not in wanted or (family.cpp_libtype and r.get("libtype") != family.cpp_libtype):
            continue
        index[row_key(cpp_key, r)] = r
    return index


def _check_cpp(family: TableFamily, cpp: dict[Key, Row], gfx: str, cu_num: int, res: ShapeEngagement) -> None:
    """Python takes splitK from its row; the kernel the compiled C++ table runs must be that row's."""
    assert family.cpp_key is not None and res.row is not None
    if family.cpp_libtype and res.row.get("libtype") != family.cpp_libtype:
        return  # another library runs this row; the compiled table is not consulted
    mcol = family.m_column or "M"
    tries = cpp_m_candidates(family, res.shape)
    row = None
    wr = family.weight_retry  # the compiled table is keyed on the weight's K (gemm_a8w8_bpreshuffle.cu: WQK)
    shape = res.shape if wr is None or wr.weight(res.shape) is None else {**res.shape,
                                                                          wr.column: str(wr.weight(res.shape))}
    for m in tries:
        row = cpp.get(row_key(family.cpp_key, dict(shape, gfx=gfx, cu_num=str(cu_num), **{mcol: str(m)})))
        if row is not None:
            break
    if row is not None and row.get("kernelId") == res.row.get("kernelId"):
        return
    res.hit = False
    if row is not None:
        differs = [f"{c}={row.get(c)}" for c in res.row if c not in family.cpp_key and c in family.shape_columns
                   and row.get(c) != res.row.get(c)]
        where = (f"the row at {mcol}={row[mcol]} (kernelId {row.get('kernelId')}"
                 + (f"; its key has no {', '.join(differs)}" if differs else "") + ")")
    else:
        where = "no row (its heuristic kernel)"
    res.reason = (f"Python takes splitK from the row at {mcol}={res.matched_m} (kernelId {res.row.get('kernelId')}), "
                  f"but the compiled C++ table (padding {tries}, key {','.join(family.cpp_key)}) "
                  f"runs the kernel of {where}: a mismatched pair; tune the row at the M both sides look up")


def is_flydsl_row(row: dict[str, str]) -> bool:
    return row.get("libtype") == "flydsl" or any(str(row.get(c, "")).startswith("flydsl_")
                                                 for c in ("kernelName", "kernelName1", "kernelName2"))
