"""The aiter backend: the command lines it builds, and AITER's real tuned rows read back as results."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from app.domain.families import FAMILIES
from app.domain.tables import read_table
from workers.backends import aiter_tuner
from workers.backends.aiter_tuner import AiterBackend, match_rows, result_from_row, tuner_command
from workers.backends.base import Batch
from tests.conftest import CONFIGS, aiter_tree_with

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_bf16_command_follows_base_tuner_flags(tmp_path):
    cmd = tuner_command(FAMILIES["bf16_gemm"], Path("/opt/aiter"), tmp_path / "u.csv", tmp_path / "t.csv", 290,
                        mp=1, python="python3")
    assert cmd == ["python3", "/opt/aiter/csrc/gemm_a16w16/gemm_a16w16_tune.py", "-i", str(tmp_path / "u.csv"),
                   "-o", str(tmp_path / "t.csv"), "--mp", "1", "--batch", "1", "--timeout", "290"]


def test_preshuffle_family_always_passes_output_and_flag(tmp_path):
    cmd = tuner_command(FAMILIES["a8w8_blockscale_bpreshuffle_gemm"], Path("/a"), Path("u"), Path("t"), 60)
    assert cmd[1] == "/a/csrc/ck_gemm_a8w8_blockscale/gemm_a8w8_blockscale_tune.py"
    assert cmd[cmd.index("-o") + 1] == "t" and "--preshuffle" in cmd
    moe = tuner_command(FAMILIES["fmoe"], Path("/a"), Path("u"), Path("t"), 60)
    assert moe[1].endswith("csrc/ck_gemm_moe_2stages_codegen/gemm_moe_tune.py")
    run = aiter_tuner.run_config_command(FAMILIES["bf16_gemm"], Path("/a"), Path("overlay.csv"), Path("u"))
    assert run[run.index("--run_config") + 1] == "overlay.csv"
    bare = aiter_tuner.run_config_command(FAMILIES["bf16_gemm"], Path("/a"), None, Path("u"), scratch=Path("s"))
    assert bare[-1] == "--run_config" and bare[bare.index("-o") + 1] == "s"


def test_untuned_csv_is_aiters_header():
    text = aiter_tuner.untuned_csv(FAMILIES["a8w8_gemm"], [{"shape": {"M": "1", "N": "2", "K": "3",
                                                                        "q_dtype_w": "torch.int8"}}])
    assert text == "M,N,K,q_dtype_w\n1,2,3,torch.int8\n"


def _lease_from(table_path: str, family: str, n: int) -> tuple[dict, list[dict]]:
    fam = FAMILIES[family]
    table = read_table((CONFIGS / table_path).read_text(), table_path)
    first = table.rows[0]
    gfx, cu = first.get("gfx", "gfx942"), first["cu_num"]
    rows = [r for r in table.rows if r.get("gfx", "gfx942") == gfx and r["cu_num"] == cu][:n]
    shapes = [{"shape_id": i + 1, "shape": {c: r[c].strip() for c in fam.shape_columns}} for i, r in enumerate(rows)]
    return {"family": family, "gfx": gfx, "cu_num": int(cu), "shapes": shapes,
            "tuned_header": list(table.header)}, rows


def _first_result(path: str, family: str, n: int):
    """Read a real shipped table back as the tuner's output for a lease of its own shapes."""
    lease, rows = _lease_from(path, family, n)
    fam = FAMILIES[family]
    matched = match_rows(fam, lease, read_table((CONFIGS / path).read_text()))
    assert len(matched) == len(rows)
    return lease, rows, result_from_row(fam, lease, 1, matched[1], 1.0, "t")


def test_real_a8w8_bpreshuffle_rows_become_results():
    lease, rows, res = _first_result("a8w8_bpreshuffle_tuned_gemm.csv", "a8w8_bpreshuffle_gemm", 20)
    assert res.status == "ok" and res.us == float(rows[0]["us"]) and res.err_ratio == float(rows[0]["errRatio"])
    assert res.kernel_name == rows[0]["kernelName"] and list(res.row) == lease["tuned_header"]


def test_real_fmoe_rows_with_percent_errors():
    _, rows, res = _first_result("model_configs/dsv4_fp8fp4_tuned_fmoe.csv", "fmoe", 5)
    errs = [float(rows[0][c].rstrip("%")) / 100 for c in ("err1", "err2")]
    assert res.err_ratio == max(errs) and "+" in res.kernel_name


def test_drives_a_tuner_process_and_posts_rows_as_they_appear(tmp_path, monkeypatch):
    lease, rows = _lease_from("bf16_tuned_gemm.csv", "bf16_gemm", 3)
    lease["shapes"].append({"shape_id": 99, "shape": dict(lease["shapes"][0]["shape"], N="7")})  # no row for it
    script_dir = tmp_path / "aiter" / "csrc" / "gemm_a16w16"
    script_dir.mkdir(parents=True)
    (script_dir / "gemm_a16w16_tune.py").write_text((FIXTURES / "stub_tuner.py").read_text())
    monkeypatch.setenv("STUB_SOURCE", str(CONFIGS / "bf16_tuned_gemm.csv"))
    gate = tmp_path / "seen"  # the stub writes its next row only once this row was emitted (stub_tuner.py)
    monkeypatch.setenv("STUB_GATE", str(gate))
    seen: list = []

    def emit(r) -> None:  # type: ignore[no-untyped-def]
        seen.append(r)
        with open(gate, "a") as f:
            f.write(f"{r.shape_id}\n")
    backend = AiterBackend(root=tmp_path / "aiter", python=sys.executable, poll_s=0.05, margin_s=2, two_phase=False)
    backend.run(Batch(lease, time.monotonic() + 60, lambda: False), emit)
    ok = [r for r in seen if r.status == "ok"]
    failed = [r for r in seen if r.status == "failed"]
    # rows 2 and 3 exist only because 1 and 2 were emitted first: rows are posted as the tuner writes them, not
    # at its end (where the stub, waiting for row 1 to be seen, gives up after 30 s: exit 3, one row)
    assert [r.shape_id for r in ok] == [1, 2, 3] and [r.shape_id for r in failed] == [99]
    assert "exit 1" in failed[0].error and "no valid candidate" in failed[0].error
    assert [r.us for r in ok] == [float(r["us"]) for r in rows]


def test_a_tuner_past_the_budget_is_stopped(tmp_path, monkeypatch):
    lease, _ = _lease_from("bf16_tuned_gemm.csv", "bf16_gemm", 3)
    script_dir = tmp_path / "aiter" / "csrc" / "gemm_a16w16"
    script_dir.mkdir(parents=True)
    (script_dir / "gemm_a16w16_tune.py").write_text((FIXTURES / "stub_tuner.py").read_text())
    monkeypatch.setenv("STUB_SOURCE", str(CONFIGS / "bf16_tuned_gemm.csv"))
    monkeypatch.setenv("STUB_DELAY", "30")  # 90 s for the three rows: only a stop ends it sooner, loaded or not
    seen = []
    t0 = time.monotonic()
    AiterBackend(root=tmp_path / "aiter", poll_s=0.05, margin_s=1, two_phase=False).run(
        Batch(lease, time.monotonic() + 2, lambda: False), seen.append)
    assert time.monotonic() - t0 < 60
    assert all(r.status == "failed" and "budget" in r.error for r in seen) and len(seen) == 3


def _tuner_class(tree, classes: dict, args: tuple[str, ...]) -> str:
    """The tuner class the script's main block runs with these flags: the one built under `if <flag var>:` where
    `<flag var> = "<flag>" in sys.argv` (gemm_moe_tune.py:6506-6522), else the last one it builds."""
    import ast
    flag_vars = {n.targets[0].id: n.value.left.value for n in ast.walk(tree)
                 if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Compare)
                 and isinstance(n.value.left, ast.Constant) and isinstance(n.value.left.value, str)}
    built = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id in classes and "Tuner" in n.func.id]
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and flag_vars.get(node.test.id) in args:
            return next(c.func.id for b in node.body for c in ast.walk(b) if c in built)
    return max(built, key=lambda c: c.lineno).func.id


@pytest.mark.parametrize("name", [n for n, f in FAMILIES.items() if f.tuner_script])
def test_the_backend_races_exactly_the_tuners_that_screen_and_confirm(name):
    """AITER's own tuner decides: the class the script runs must keep every candidate in --profile_file (its
    post_process writes it) and confirm through the production op (a run_config of its own, not TunerCommon's
    "not implemented"). Guards TableFamily.tuner_races and aiter_tuner.TUNABLE."""
    import ast
    fam = FAMILIES[name]
    root = aiter_tree_with(fam.tuner_script, "aiter/utility/base_tuner.py")
    classes = {}
    for path in (root / "aiter/utility/base_tuner.py", root / fam.tuner_script):
        tree = ast.parse(path.read_text())
        classes.update({c.name: c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)})

    def method(cls: str, name: str):
        c = classes.get(cls)
        if c is None:
            return None
        own = next((f for f in c.body if isinstance(f, ast.FunctionDef) and f.name == name), None)
        if own is not None:
            return cls, own
        return next((m for b in c.bases if isinstance(b, ast.Name) and (m := method(b.id, name))), None)

    cls = _tuner_class(tree, classes, fam.tuner_args)
    where_run, run_config = method(cls, "run_config")
    _, post = method(cls, "post_process")
    screens = "profile_file" in ast.unparse(post)
    confirms = where_run != "TunerCommon"
    assert fam.tuner_races == (screens and confirms), (cls, screens, confirms)
    assert (name in aiter_tuner.TUNABLE) == fam.tuner_races


def test_the_backend_reports_the_kernel_catalog_the_images_aiter_has():
    """Issue 35: the aiter backend reported no catalog, so an upgrade's "kernel gone" never fired on the real path.
    It reads the family's kernel list from AITER's own code: every kernel AITER's shipped a8w8 table names is in it
    (the table is tuned by that list), and a name from another family's list is not."""
    import csv

    from tests.conftest import configs_dir
    from workers.backends.aiter_tuner import AiterBackend
    root = aiter_tree_with("csrc/ck_gemm_a8w8/gemm_a8w8_common.py")
    catalog = AiterBackend(root=root).kernel_catalog()
    names = set(catalog["a8w8_gemm"])
    shipped = {r["kernelName"] for r in csv.DictReader((configs_dir() / "a8w8_tuned_gemm.csv").open())}
    assert shipped and shipped <= names and len(names) > len(shipped)
    assert all(n.startswith("a8w8_rowwise_") for n in names)
    assert set(catalog) == {"a8w8_gemm"}  # only families whose every candidate list is known
