"""What a built overlay derives once and reuses (app/services/overlays.py Overlay.lookup / digest): the verdicts
through a kept lookup equal the verdicts of a fresh one for each form, lookup gfx and compiled-table build
targets in turn, on AITER's shipped tables; each of these changes the verdicts here, so a memo key that left one
out would hand a later one an earlier one's lookup."""

from __future__ import annotations

import pytest

from app.domain import engagement as eng
from app.domain.deploy import Shipped
from app.domain.families import CURRENT
from app.domain.headers import tuned_schema
from app.domain.tables import Table, read_table, rows_digest
from app.services.overlays import Overlay
from tests.conftest import CONFIGS


def verdicts(ov: Overlay, combos: list[tuple], shapes: list[dict]) -> list[list]:
    """Per (form, gfx, cu_num, build targets), in turn on one overlay: the kept lookup's verdicts, after
    checking they equal a fresh check's."""
    out = []
    for form, gfx, cu, targets in combos:
        art = ov.artifacts()[form]
        table = art.table if art.table is not None else Table(ov.table.header)
        args = (ov.family, ov.schema.key_columns, gfx, cu, shapes, table)
        fresh = eng.check(*args, cpp_at=(gfx, cu), build_targets=targets)
        kept = eng.check(*args, cpp_at=(gfx, cu), build_targets=targets, prepared=ov.lookup(form, gfx, targets))
        assert kept == fresh, (form, gfx, cu, targets)
        assert ov.digest(form) == rows_digest(table)
        out.append([(c.hit, c.row) for c in fresh])
    return out


def test_each_form_and_each_set_of_build_targets_has_its_own_lookup():
    fam = CURRENT.family("a8w8_gemm")
    default = read_table((CONFIGS / fam.tuned_file).read_text(), fam.tuned_file)
    untuned = read_table((CONFIGS / fam.untuned_file).read_text()).header
    s0 = default.rows[0]
    mine = dict(s0, kernelId="99", us="0.5", kernelName="mine")  # beats the shipped row of its key
    ov = Overlay(fam, CURRENT, tuned_schema(fam, default.header), Table(default.header, [mine], "svc.csv"),
                 Shipped(default, [], untuned, True), s0["gfx"])
    assert ov.artifacts()["layer"].excluded_shipped == 1  # the layer keeps the shipped row, the merged file ours
    here, other = (s0["gfx"], int(s0["cu_num"])), (s0["gfx"], int(s0["cu_num"]) + 1)
    shapes = [{c: s0[c] for c in fam.shape_columns}]
    layer, merged, elsewhere = verdicts(ov, [("layer", *here, (here,)), ("merged", *here, (here,)),
                                             ("merged", *here, (other,))], shapes)
    assert layer[0][0] and layer[0][1]["kernelId"] == s0["kernelId"]
    assert merged[0][0] and merged[0][1]["kernelId"] == "99"
    assert not elsewhere[0][0]  # the compiled table built for another cu_num runs another kernel
    assert ov.digest("layer") != ov.digest("merged")


def test_each_lookup_gfx_has_its_own_lookup():
    """fused_moe.py _ensure_gfx_column: a row without gfx takes the live GPU's (gfx_from_cu_num of a cu_num
    it does not know), so the loaded rows themselves depend on the gfx looked up."""
    fam = CURRENT.family("fmoe")
    shipped = read_table((CONFIGS / fam.tuned_file).read_text(), fam.tuned_file)
    assert "gfx" not in shipped.header
    row = dict(shipped.rows[0], cu_num="100")
    ov = Overlay(fam, CURRENT, tuned_schema(fam, shipped.header), Table(shipped.header, [row], "svc.csv"),
                 Shipped(None, [], None, False), "gfx942")
    shapes = [{c: row[c] for c in fam.shape_columns}]
    targets = (("gfx942", 100),)  # no compiled table: the same
    on_942, on_950 = verdicts(ov, [("layer", "gfx942", 100, targets), ("layer", "gfx950", 100, targets)], shapes)
    assert on_942[0][0] and on_950[0][0]
    assert on_942[0][1]["gfx"] == "gfx942" and on_950[0][1]["gfx"] == "gfx950"


def test_one_key_being_made_holds_up_its_own_askers_only():
    """Overlay.memo: single-flight per key; a lookup of one form does not wait while another form's is made."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    fam = CURRENT.family("bf16_gemm")
    ov = Overlay(fam, CURRENT, tuned_schema(fam, fam.tuned_header), Table(fam.tuned_header, [], "svc.csv"),
                 Shipped(None, [], None, False), "gfx942")
    started, release, made = threading.Event(), threading.Event(), []

    def slow() -> object:
        made.append(1)
        started.set()
        assert release.wait(10)
        return object()
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(ov.memo, "slow", slow)
        assert started.wait(10)
        second = pool.submit(ov.memo, "slow", slow)  # waits for the first asker's value
        other = pool.submit(ov.memo, "other", lambda: "quick")
        assert other.result(timeout=5) == "quick"  # while "slow" is still being made
        assert not first.done() and not second.done()
        release.set()
        assert first.result(timeout=10) is second.result(timeout=10) and made == [1]

    tries: list[int] = []

    def boom() -> object:
        tries.append(1)
        raise ValueError("no")
    for _ in range(2):  # a make that raised is not kept: the next asker makes it again
        with pytest.raises(ValueError):
            ov.memo("boom", boom)
    assert len(tries) == 2
