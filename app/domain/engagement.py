"""Will AITER use the table? Rebuild the run-time key for each captured shape and look it up the way the
image's AITER release loads and reads the table it builds from what is deployed (see deploy.build)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from app.domain.families import GPU_FP8, TableFamily, gfx_from_cu_num, gpu_fp8
from app.domain.keys import cpp_m_candidates, lookup_keys, moe_token, row_key
from app.domain.row_memo import NO_MEMO, RowMemo
from app.domain.tables import Table


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


def same_row(theirs: dict, ours: dict) -> bool:
    """The row AITER picked (as its loader read it: numbers parsed) is ours: equal in the ROW_IDENTITY cells
    both have."""
    return all(_norm(theirs.get(c)) == _norm(ours.get(c)) for c in ROW_IDENTITY if c in theirs and c in ours)


def row_identity(row: dict | None) -> dict | None:
    """What a proof posts of the row AITER picked: its ROW_IDENTITY cells, as text."""
    return None if row is None else {c: "" if _norm(row[c]) == "" else str(row[c]) for c in ROW_IDENTITY
                                     if c in row}


class LookupRaises(Exception):
    """AITER's loader raises on this table (a repeated key where the lookup needs a unique index)."""


def _m_at(family: TableFamily, keys: tuple[str, ...]) -> int | None:
    return keys.index(family.m_column) if family.m_column in keys else None


def _rest(key: tuple, mi: int | None) -> tuple:
    """A lookup key less its M cell (all of it where the key has none)."""
    return key if mi is None else key[:mi] + key[mi + 1:]


def _by_rest(family: TableFamily, keys: tuple[str, ...], index: dict) -> dict[tuple, list]:
    """The index's keys grouped by their cells besides M, in index order, with their Ms: what a miss is
    explained from (_miss_reason) without reading every row for each shape that misses."""
    mi = _m_at(family, keys)
    out: dict[tuple, list] = {}
    for k in index:
        out.setdefault(_rest(k, mi), []).append(None if mi is None else k[mi])
    return out


def _miss_reason(family: TableFamily, keys: tuple[str, ...], want: tuple, tried: list, by_rest: dict,
                 closest: dict) -> str:
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
                 memo: RowMemo = NO_MEMO) -> dict:
    """memo: each row's key (and whole row), kept for the rows it holds."""
    index: dict[tuple, dict[str, str]] = {}
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
    index: dict | None = None  # lookup key: row (None: a wildcard family, or nothing is looked up)
    cpp: dict | None = None  # the compiled table's (_cpp_index)
    by_rest: dict = field(default_factory=dict)  # _by_rest of index
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
    op reads, _with_env). Raises LookupRaises where the loader itself would raise on the table."""
    cpp_at = cpp_at or (gfx, cu_num)
    lk = prepared or prepare(family, key_columns, gfx, table, build_targets or (cpp_at,))
    if lk.raises is not None:
        raise LookupRaises(lk.raises)
    if lk.misses is not None:
        return _op_paths(family, cpp_at[0], _default_stages_wrapped(family, cpp_at[0], flydsl, arch, env, [
            ShapeEngagement(shape, False, [m for m, _ in lookup_keys(family, lk.tried_on, gfx, cu_num, shape)],
                            reason=lk.misses) for shape in shapes]), flydsl, arch)
    key_columns, rows, index, cpp = lk.key_columns, lk.rows, lk.index, lk.cpp
    if index is None:  # family.key_match == "wildcard"
        return [_wildcard(family, key_columns, gfx, cu_num, raw, rows) for raw in shapes]
    out: list[ShapeEngagement] = []
    closest: dict[tuple, str] = {}
    for raw in shapes:
        shape = family.looked_up(with_env(family, raw, env), cpp_at[0], arch)  # remaps run on the device's gfx
        refused = family.moe_op.refuses(shape, cpp_at[0], flydsl, arch) if family.moe_op else None
        if refused is not None:  # the op raises before it looks anything up
            out.append(ShapeEngagement(raw, False, [], reason=f"AITER raises on this call ({refused.where}: "
                                                              f"{refused.reason})", fails=True))
            continue
        if family.moe_op and not family.moe_op.reads_table(shape, cpp_at[0], arch):
            # a capture of this family is a lookup of its table (its log line): such a call is one a list posted
            # by hand holds, or one a capture cannot tell from it (a shared-expert call); what runs it (that
            # table's row or default, then the op's stage check) depends on that table: unknown (issue 35)
            why = f"the op looks this call up in another table ({family.moe_op.where}), not this one"
            out.append(ShapeEngagement(raw, False, [], reason=f"unknown: depends on {why}", unknown=why))
            continue
        lacking = _tier_lacking(family, key_columns, gfx, cu_num, shape, index, flydsl, cpp_at[0], arch)
        if lacking is not None:
            assert family.moe_op is not None and family.moe_op.tiers_cover is not None
            cover = family.moe_op.tiers_cover
            out.append(ShapeEngagement(raw, False, [lacking], reason=f"AITER raises on this call ({cover.where}: "
                                       f"{cover.reason}): no row it runs at {family.m_column}={lacking}", fails=True))
            continue
        cands = lookup_keys(family, key_columns, gfx, cu_num, shape)
        tried = [m for m, _ in cands]
        res = None
        skipped = []
        for m, k in cands:
            row = index.get(k)
            if row is None:
                continue
            # bf16's lookup tells a FlyDSL row by its libtype alone (tuned_gemm.py:163), other families by names too
            fly = row.get("libtype") == "flydsl" if family.flydsl_catalog else is_flydsl_row(row)
            if (fly and not (flydsl and family.flydsl_known(row)) and family.flydsl_miss != "ignored"
                    and not family.other_op(shape)
                    and not (family.moe_op and family.moe_op.routes)):  # the op's routes say what runs
                if family.flydsl_miss == "skip":  # tuned_gemm.py:163-177: next padded-M candidate
                    skipped.append(m)
                    continue
                if family.flydsl_miss == "default":
                    res = ShapeEngagement(raw, False, tried, m, row, reason=(
                        "FlyDSL row, but flydsl is not importable in the serving image: the op falls back to its "
                        "default kernel"))
                    break
                res = ShapeEngagement(raw, False, tried, m, row, reason=(
                    "FlyDSL row, but flydsl is not importable in the serving image: AITER has no fallback and "
                    "raises in the MoE stage"), fails=True)
                break
            bad = family.unreadable(row)
            if bad is not None:  # a shipped row the op cannot parse (posted ones are refused)
                res = ShapeEngagement(raw, False, tried, m, row, reason=f"AITER raises reading the row's {bad[0]}: "
                                                                        f"{bad[1]}", fails=True)
                break
            if family.moe_op and family.moe_op.routes:
                use, why = family.moe_op.row_use(shape, row, cpp_at[0], flydsl, arch)
                if use != "hit":
                    res = ShapeEngagement(raw, False, tried, m, row, fails=use == "fails", reason=why)
                    break
            use = row_use(family, shape, row)
            if use != "hit":
                res = ShapeEngagement(raw, False, tried, m, row, fails=use == "fails", reason=(
                    f"the op does not run a {row.get('libtype')!r} row: it "
                    + ("raises" if use == "fails" else "falls back to its default kernel")))
                break
            res = ShapeEngagement(raw, True, tried, m, row)
            if cpp is not None:
                _check_cpp(family, cpp, cpp_at[0], cpp_at[1], res)
            break
        if res is None:
            reason = _miss_reason(family, key_columns, cands[0][1], tried, lk.by_rest, closest)
            if skipped:
                reason = (f"FlyDSL rows at {family.m_column}={skipped} are skipped (flydsl is not importable in the "
                          f"serving image, or the kernel is not in its catalog); " + reason)
            res = ShapeEngagement(raw, False, tried, reason=reason)
            raising = next((r for r in family.miss_raises if r.raises(dict(shape, gfx=gfx))), None)
            if raising is not None:
                res.fails, res.reason = True, (f"AITER raises on a shape without a row ({raising.where}: "
                                               f"{raising.reason}): " + reason)
        out.append(res)
    def again(s: dict[str, str]) -> ShapeEngagement:  # this check, of one shape
        return check(family, key_columns, gfx, cu_num, [s], table, flydsl, cpp_at, build_targets, lk, arch, env)[0]
    out = _padded_weight_retry(family, lk, gfx, cu_num, out, again)
    out = _op_paths(family, cpp_at[0], _default_stages_wrapped(family, cpp_at[0], flydsl, arch, env, out), flydsl,
                    arch)
    return _calls_a_capture_cannot_tell(family, cpp_at[0], arch, env, out, again)


def _calls_a_capture_cannot_tell(family: TableFamily, device_gfx: str, arch: str | None, env: dict[str, str] | None,
                                 out: list[ShapeEngagement],
                                 again: Callable[[dict[str, str]], ShapeEngagement]) -> list[ShapeEngagement]:
    """A MoE lookup's log line does not say which call made it (MoeOpPath.call_variants: fused_moe, or fused_moe
    with shared experts, which fhmoe_ runs with its own q_dtype_a and its wrapper step on the stages, fhmoe.py
    :563-613; the gate mode): where more than one derives the captured q_dtype_a and their verdicts differ, the
    verdict is unknown, naming them (again: this check of one shape)."""
    op = family.moe_op
    if op is None or len(op.call_variants) < 2:
        return out
    for res in out:
        if res.unknown:
            continue
        cells = family.remap(with_env(family, res.shape, env))
        calls = op.variants_for(cells, device_gfx, arch)
        if len(calls) < 2:
            continue
        got = [(v, again({**res.shape, **v})) for v in calls]
        if len({(g.verdict, str(g.row)) for _, g in got}) > 1:
            res.unknown = ("depends on the call, which the capture does not say: " + "; ".join(
                f"{', '.join(f'{k}={x}' for k, x in v.items())}: {g.verdict}" for v, g in got))
            res.reason = f"unknown: {res.unknown}" + (f" (the first: {res.reason})" if res.reason else "")
            res.hit = res.fails = False  # counted as neither
    return out


def _padded_weight_retry(family: TableFamily, lk: Lookup, gfx: str, cu_num: int, out: list[ShapeEngagement],
                         again: Callable[[dict[str, str]], ShapeEngagement]) -> list[ShapeEngagement]:
    """gemm_a8w8_bpreshuffle (ops/gemm_op_a8w8.py:711-742, family.weight_retry): a weight smaller than the activation
    in K raises before the lookup; a miss at the activation's K is looked up again at a padded weight's K, whose row
    runs (again: this check of one shape). A shape without the weight's K (a capture's: AITER logs the first lookup)
    is unknown where a row at a larger K could be what the retry finds."""
    wr = family.weight_retry
    if wr is None or lk.index is None:
        return out
    col, keys = wr.column, lk.key_columns
    at = keys.index(col)
    larger: dict[tuple, list[int]] = {}  # the index's keys less K: the Ks rows exist at
    for k in lk.index:
        if str(k[at]).isdigit():
            larger.setdefault(k[:at] + k[at + 1:], []).append(int(k[at]))
    for i, res in enumerate(out):
        if not wr.applies(res.shape) or not str(res.shape.get(col, "")).isdigit():
            continue
        own, w = int(res.shape[col]), wr.weight(res.shape)
        if w is not None and w < own:
            out[i] = ShapeEngagement(res.shape, False, res.tried_m, fails=True,
                                     reason=f"AITER raises on this call ({wr.where}: {wr.raises})")
            continue
        if res.hit or res.fails or res.row is not None:
            continue
        if w is not None:
            if w > own:
                got = again({**res.shape, col: str(w)})
                got.shape, got.reason = res.shape, (f"no row at {col}={own}; AITER looks the weight's {col}={w} up "
                                                    f"({wr.where})" + (f": {got.reason}" if got.reason else ""))
                out[i] = got
            continue
        rest = [k for _, k in lookup_keys(family, keys, gfx, cu_num, res.shape)]  # the keys the op tried
        ks = [x for x in sorted({x for r in rest for x in larger.get(r[:at] + r[at + 1:], []) if x > own})
              if again({**res.shape, col: str(x)}).hit]  # the retry would run a row there
        if ks:
            res.unknown = (f"depends on the weight's {col} (the capture has the activation's, {own}): a weight padded "
                           f"to {col}={ks} is looked up again there and its row runs ({wr.where})")
            res.reason = f"unknown: {res.unknown}; at the activation's {col}: {res.reason}"
    return out


def _default_stages_wrapped(family: TableFamily, device_gfx: str, flydsl: bool, arch: str | None,
                            env: dict[str, str] | None, out: list[ShapeEngagement]) -> list[ShapeEngagement]:
    """A shared-expert call without a row still has its default stages put through fhmoe_'s wrapper step, which
    raises unless they are the two FlyDSL stages (fhmoe.py:304-317, :563-613; without FlyDSL they never are):
    MoeOpPath.stages_raise_on_miss. A call looked up in another table (tried_m empty) is not this table's miss."""
    op = family.moe_op
    if op is None or not op.stages:
        return out
    for res in out:
        if res.hit or res.fails or res.row is not None or not res.tried_m:
            continue
        why = op.stages_raise_on_miss(family.looked_up(with_env(family, res.shape, env), device_gfx, arch),
                                      device_gfx, flydsl, arch)
        if why is not None:
            res.fails, res.reason = True, f"AITER raises on this call ({why}): no row, and " + res.reason
    return out


def with_env(family: TableFamily, shape: dict[str, str], env: dict[str, str] | None) -> dict[str, str]:
    """The call's cells with the serving environment's variables its MoE op reads (MoeOpPath.env: fused_moe.py:76,
    :768, :781-784, :799-800), as the capture's env carries them; one unset keeps its unset value (call_defaults)."""
    if family.moe_op is None or not env:
        return shape
    return dict(shape, **{k: env[k] for k in family.moe_op.env if k in env})


def _tier_lacking(family: TableFamily, key_columns: tuple[str, ...], gfx: str, cu_num: int, shape: dict[str, str],
                  index: dict, flydsl: bool, device_gfx: str, arch: str | None) -> int | None:
    """The first padded token tier up to the call's token (1, 2, 4, ... and its own) the table has no row the op
    runs at, looked up with moe_op.tier_cells (fhmoe.py:345-385); None: every tier covered, or no such check."""
    op = family.moe_op
    if op is None or op.tiers_cover is None or family.m_column is None:
        return None
    m = int(shape[family.m_column])
    at = {c: gpu_fp8(device_gfx) if v == GPU_FP8 else v for c, v in op.tier_cells}
    for t in sorted({moe_token(1 << e) for e in range(m.bit_length())} | {moe_token(m)}):
        cells = dict(shape, **at, **{family.m_column: str(t)})
        row = next((r for _, k in lookup_keys(family, key_columns, gfx, cu_num, cells)
                    if (r := index.get(k)) is not None), None)
        if row is None or op.row_use(cells, row, device_gfx, flydsl, arch)[0] != "hit":
            return t
    return None


def _op_paths(family: TableFamily, device_gfx: str, out: list[ShapeEngagement], flydsl: bool = True,
              arch: str | None = None) -> list[ShapeEngagement]:
    """The op's own paths whatever the table holds (family.op_paths, on the device's gfx, with get_gfx()'s answer
    arch and FlyDSL importable or not): a raise overrides any verdict, a default kernel a hit."""
    for res in out:
        path = family.op_path(dict(res.shape, flydsl=str(flydsl)), res.row, device_gfx, arch)
        if path is None or (path.runs == "default" and not res.hit):
            continue
        res.hit, res.fails = False, path.runs == "raises"
        if res.fails:
            res.unknown = None  # it raises whatever the capture leaves out
        res.reason = (f"AITER raises here ({path.where}: {path.reason})" if res.fails else
                      f"the op runs its default kernel, not the row ({path.where}: {path.reason})")
    return out


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
               memo: RowMemo = NO_MEMO) -> dict | None:
    """build_tune_dict: rows of the build targets (and the compiled libtype) only, a plain dict, so the last row
    of a key wins."""
    if family.cpp_key is None:
        return None
    cols, cpp_key = ("gfx", "cu_num") if "gfx" in family.cpp_key else ("cu_num",), family.cpp_key  # targets' rows
    wanted = {row_key(cols, {"gfx": g, "cu_num": str(c)}) for g, c in targets}
    index = {}
    for r, at in zip(rows, memo.per_row(("key", cols), rows, lambda r: row_key(cols, r))):
        if at not in wanted or (family.cpp_libtype and r.get("libtype") != family.cpp_libtype):
            continue
        index[row_key(cpp_key, r)] = r
    return index


def _check_cpp(family: TableFamily, cpp: dict, gfx: str, cu_num: int, res: ShapeEngagement) -> None:
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
