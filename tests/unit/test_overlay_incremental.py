"""An overlay built on a kept Shipped (its memo: app/domain/row_memo.py), result after result, equals one built from
scratch at every step: each deploy form's artifact (files, the table AITER builds, the overlay file it deploys,
refusals, rows left out), each form's digest, its lookups and the verdicts on them. On AITER's shipped tables
(TUNER_AITER_CONFIGS for the full ones), for families with each merge rule: raise after rewriting (current),
the lowest us silently (0.1.7), overlay first with gfx backfilled (fmoe), concatenated (grouped fmoe).

The results in turn: a new key; a key the image ships (the layer raises in AITER: its rows are left out); a
better result for the first key (it replaces the row); a result with an integer cell blank (pandas reads that
column as float in the overlay, so every file's integers are written as floats: the shipped rows change too);
the same tables served on another GPU; a table added to the image (a new Shipped, kept from then on).
"""

from __future__ import annotations

import pytest

from app.domain import deploy
from app.domain import engagement as eng
from app.domain.families import CURRENT, INT, RELEASE_0_1_7, AiterRelease, column_kind
from app.domain.headers import parse_header_line, tuned_schema
from app.domain.keys import m_candidates
from app.domain.row_memo import NO_MEMO
from app.domain.tables import Table, read_table, rows_digest
from app.services.overlays import Overlay
from tests.conftest import CONFIGS

CASES = [(CURRENT, "a8w8_blockscale_gemm"), (CURRENT, "bf16_gemm"), (CURRENT, "fmoe"),
         (CURRENT, "a8w8_bpreshuffle_gemm"), (CURRENT, "grouped_fmoe"), (RELEASE_0_1_7, "a8w8_gemm"),
         (RELEASE_0_1_7, "fmoe")]


def read_shipped(release: AiterRelease, family, extra: list[Table] = ()) -> deploy.Shipped:
    """What a worker reports (schemas.shipped_for): the default, the model_configs its glob takes, the untuned
    header; each call reads the files again (new tables: nothing kept)."""
    d = CONFIGS / release.default_file(family)
    default = read_table(d.read_text(), d.name, family.comment_prefix) if d.is_file() else None
    mcs = [read_table(p.read_text(), f"model_configs/{p.name}", family.comment_prefix)
           for p in sorted((CONFIGS / "model_configs").glob(f"*{family.merge_name}*{release.model_configs_suffix}"))
           if "untuned" not in p.name]
    u = CONFIGS / family.untuned_file
    untuned = parse_header_line(u.read_text().splitlines()[0]) if u.is_file() else family.untuned_header
    return deploy.Shipped(default, mcs + [Table(t.header, [dict(r) for r in t.rows], t.name) for t in extra],
                          untuned, True)


def fresh(ov: Overlay, extra: list[Table]) -> Overlay:
    """The same overlay built from scratch: the tables read again, nothing kept (no memo at all)."""
    shipped = read_shipped(ov.release, ov.family, extra)
    shipped.memo = NO_MEMO
    return Overlay(ov.family, ov.release, ov.schema, ov.table, shipped, ov.live_gfx)


def shapes_of(family, rows: list[dict]) -> list[dict]:
    return [{c: r[c] for c in family.shape_columns if c in r} for r in rows]


def same(kept: Overlay, scratch: Overlay, shapes: list[dict]) -> None:
    arts, want = kept.artifacts(), scratch.artifacts()
    assert arts.keys() == want.keys()
    for form in deploy.FORMS:
        assert arts[form] == want[form], form  # files, table, overlay, refusals, rows left out: every cell
        table = want[form].table or Table(())
        assert kept.digest(form) == scratch.digest(form) == rows_digest(table), form
        if want[form].table is None:
            continue
        for gfx, cu in {(kept.live_gfx, 304), ("gfx950", 256)}:
            targets = ((gfx, cu),)
            lk, lk0 = kept.lookup(form, gfx, targets), scratch.lookup(form, gfx, targets)
            assert lk == lk0, (form, gfx)
            if lk0.raises is None:
                args = (kept.family, kept.schema.key_columns, gfx, cu, shapes, table)
                assert (eng.check(*args, prepared=lk, build_targets=targets)
                        == eng.check(*args, prepared=lk0, build_targets=targets)), (form, gfx)
    for keys in (None, eng.lookup_columns(kept.family, kept.schema.key_columns)):
        assert (deploy.without_shipped_keys(kept.release, kept.family, kept.shipped, kept.table, kept.live_gfx, keys)
                == deploy.without_shipped_keys(scratch.release, scratch.family, scratch.shipped, scratch.table,
                                               scratch.live_gfx, keys))


def unused_m(family, shipped: deploy.Shipped, base: dict) -> str:
    """An M (token) no shipped row has: one AITER looks up as is where there is one."""
    have = {r.get(family.m_column) for t in shipped.tables for r in t.rows}
    free = [m for m in [*(1 << k for k in range(4, 20)), *range(4097, 9000)] if str(m) not in have]
    return str(next((m for m in free if m_candidates(family, dict(base, **{family.m_column: str(m)}))[:1] == [m]),
                    free[0]))


@pytest.mark.parametrize("release,name", CASES, ids=[f"{r.name}-{n}" for r, n in CASES])
def test_an_overlay_built_on_kept_shipped_tables_equals_one_built_from_scratch(release, name):
    family = release.family(name)
    shipped = read_shipped(release, family)
    if not shipped.tables:
        pytest.skip(f"{release.name}: AITER ships no {name} table in {CONFIGS}")
    header = shipped.tables[0].header
    schema = tuned_schema(family, header)
    last = shipped.tables[-1].rows
    theirs = dict(last[len(last) // 2])  # a shipped row: our result for its key
    ours = dict(shipped.tables[0].rows[0], **{family.m_column: unused_m(family, shipped, shipped.tables[0].rows[0])})
    better = dict(ours, us="0.001", **{c: "7" for c in ("kernelId", "solidx") if c in ours})
    if "us" in theirs:
        theirs["us"] = "0.002"
    blank = next((c for c in header if column_kind(c) == INT and c not in schema.key_columns
                  and all(r.get(c, "").isdecimal() for r in last)), None)
    gap = dict(better, **{family.m_column: str(int(better[family.m_column]) + 1)}, **({blank: ""} if blank else {}))
    # a table added to the image, written before tables had gfx and with a cu_num AITER does not know: its gfx
    # is the serving GPU's (gfx_from_cu_num), so what it is filled to differs by the GPU
    old = [c for c in header if c != "gfx"]
    extra = Table(tuple(old), [{c: r[c] for c in old} | {"us": "0.0005", "cu_num": "100"} for r in [ours, theirs]],
                  f"model_configs/zz_{family.tuned_file}")
    tagged = Table((*header[:-1], "_tag", header[-1]), [dict(better, _tag="")], "svc.csv")  # a column theirs lack
    shipped_only, added = [], [extra]
    steps = [(shipped_only, [ours], "gfx942"), (shipped_only, [ours], "gfx950"),  # the same tables, another GPU
             (shipped_only, [ours, theirs], "gfx942"), (shipped_only, [better, theirs], "gfx942"),
             (shipped_only, [better, theirs, gap], "gfx942"), (shipped_only, tagged, "gfx942"),
             (added, [better, theirs], "gfx942"), (added, [better, theirs, gap], "gfx950")]
    kept, kept_for = None, None
    for tables, rows, gfx in steps:
        if tables is not kept_for:  # a table added: another Shipped, kept from then on
            kept, kept_for = read_shipped(release, family, tables), tables
        overlay = (rows if isinstance(rows, Table) else
                   Table(header, [dict(r) for r in rows], "svc_0123456789ab_" + family.tuned_file))
        ov = Overlay(family, release, schema, overlay, kept, gfx)
        same(ov, fresh(ov, tables), shapes_of(family, overlay.rows + [r for t in kept.tables for r in t.rows[:3]]))
    plain = Overlay(family, release, schema, Table(header, [ours], "svc.csv"), kept, "gfx942").artifacts()["layer"]
    if blank and not family.env_concat and plain.refused is None:  # the blank reached the shipped rows: the memo
        layer = Overlay(family, release, schema, Table(header, [gap], "svc.csv"), kept, "gfx942").artifacts()["layer"]
        assert layer.table.rows[0][blank].endswith(".0") and not plain.table.rows[0][blank].endswith(".0")
