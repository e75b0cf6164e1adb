"""Per-release and per-family AITER rules the service applies as data (families.py), beyond what the
differential tests (tests/differential) check against AITER's own code."""

from __future__ import annotations

from app.domain import deploy
from app.domain.families import CURRENT, RELEASE_0_1_7, get_family, release_for
from app.domain.shapes import make_shape
from app.domain.tables import Table, read_table
from tests.conftest import CONFIGS

FMOE = get_family("fmoe")


def test_a_captured_per_128x128_is_stored_as_the_per_1x128_aiter_looks_up():
    raw = {"token": 32, "model_dim": 7168, "inter_dim": 256, "expert": 256, "topk": 8,
           "act_type": "ActivationType.Silu", "dtype": "torch.bfloat16", "q_dtype_a": "torch.float8_e4m3fn",
           "q_dtype_w": "torch.float8_e4m3fn", "q_type": "QuantType.per_128x128", "use_g1u1": 1,
           "doweight_stage1": 0}
    assert make_shape(FMOE, raw).as_dict()["q_type"] == "QuantType.per_1x128"  # fused_moe.py:1310


def test_the_merged_fmoe_file_keeps_aiters_own_one_stage_rows():
    mcs = [read_table(p.read_text(), f"model_configs/{p.name}")
           for p in sorted((CONFIGS / "model_configs").glob("*tuned_fmoe*.csv")) if "untuned" not in p.name]
    one_stage = [r for t in mcs for r in t.rows if r.get("run_1stage") == "1" and not r.get("kernelName2")]
    assert one_stage, "the fixtures carry shipped 1-stage rows (empty kernelName2)"
    default = read_table((CONFIGS / "tuned_fmoe.csv").read_text(), "tuned_fmoe.csv")
    shipped = deploy.Shipped(default, mcs, FMOE.untuned_header, True)
    art = deploy.build(CURRENT, FMOE, "merged", shipped, Table(default.header, [], "svc_fmoe.csv"), "gfx942")
    assert art.refused is None and len(art.table.rows) >= len(one_stage)


def test_releases_are_told_apart_by_version_and_differ_as_data():
    assert release_for("0.1.7.post2.dev18") is RELEASE_0_1_7 and release_for("0.1.13.dev0+e4048607a5") is CURRENT
    old = RELEASE_0_1_7.family("fmoe")
    assert old.lookup_ignores == () and old.padding == "moe_0_1_7" and FMOE.lookup_ignores == ("act_type",)
    assert RELEASE_0_1_7.default_file(get_family("bf16_gemm")) == "tuned_gemm.csv"
    assert RELEASE_0_1_7.merge_key(("M", "N", "K"), ("cu_num", "M", "N", "K", "us")) == ("M", "N", "K")
    assert CURRENT.merge_key(("M", "N", "K"), ("gfx", "cu_num", "M", "N", "K", "us")) == ("M", "N", "K", "cu_num",
                                                                                        "gfx")


def test_no_drop_in_is_offered_while_the_images_tables_are_unknown():
    bf16 = get_family("bf16_gemm")
    overlay = Table(bf16.tuned_header, [], "svc_bf16_tuned_gemm.csv")
    arts = deploy.artifacts(CURRENT, bf16, deploy.Shipped(None, [], None, False), overlay, "gfx942",
                            bf16.key_columns)
    assert arts["model_configs_dropin"].refused and "unknown" in arts["model_configs_dropin"].refused
    assert arts["layer"].refused is None  # one path: AITER reads it as is
