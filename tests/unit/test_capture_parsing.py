"""Capture formats: JSON, AITER untuned CSVs (the real shipped ones), and AITER's own log lines."""

from __future__ import annotations

import pytest

from app.domain import capture_parsing as cp
from app.domain.families import FAMILIES
from app.domain.log_lines import parse_log
from app.domain.shapes import ShapeError
from tests.conftest import CONFIGS

BF16 = FAMILIES["bf16_gemm"]


def aiter_lines() -> str:
    """Lines rendered with AITER's own f-strings (ROCm/aiter e4048607a5), as a server logs them."""
    M, N, K, bias, scaleAB, bpreshuffle = 20, 4096, 4096, False, False, False
    dtype, otype = "torch.bfloat16", "torch.bfloat16"
    f = "/tmp/aiter_configs/bf16_tuned_gemm.csv"
    lines = [
        # tuned_gemm.py:232 (miss) and :183 (hit)
        f"[aiter] shape is M:{M}, N:{N}, K:{K} {dtype=} {otype=} {bias=}, {scaleAB=}, {bpreshuffle=}, not found "
        f"tuned config in {f}, will use default config! using torch solution:0",
        f"[aiter] shape is M:{M}, N:{N}, K:{K} {dtype=} {otype=} {bias=}, {scaleAB=}, {bpreshuffle=}, not found "
        f"tuned config in {f}, will use default config! using torch solution:0",
    ]
    M, padded_M, cu_num, libtype, kernelName = 100, 112, 304, "asm", "_ZN5aiter39bf16gemm_fp32bf16_tn_64x64E"
    lines.append(f"[aiter] shape is M:{M}, N:{N}, K:{K} {dtype=} {otype=} {bias=}, {scaleAB=}, {bpreshuffle=} found "
                 f"padded_M: {padded_M}, N:{N}, K:{K} is tuned on cu_num = {cu_num} in {f}, libtype is {libtype}, "
                 f"kernel name is {kernelName}")
    # gemm_op_a8w8.py:551 (a8w8 miss) and :488 (blockscale miss), :483 (blockscale hit)
    q_dtype_w, tf = "torch.int8", "/tmp/aiter_configs/a8w8_tuned_gemm.csv"
    lines.append(f"[aiter] shape is M:{M}, N:{N}, K:{K}, q_dtype_w:{q_dtype_w}, not found tuned config in {tf}, "
                 f"will use default config!")
    tf = "/opt/aiter/aiter/configs/a8w8_blockscale_tuned_gemm.csv"
    lines.append(f"[aiter] shape is M:{M}, N:{N}, K:{K}, not found tuned config in {tf}, will use default config!")
    lines.append(f"[aiter] shape is M:{M}, N:{N}, K:{K}, found padded_M: {padded_M}, N:{N}, K:{K} is tuned on "
                 f"cu_num = {cu_num} in {tf} , kernel name is a8w8_blockscale_1x128x128_256x16x64!")
    # batched_gemm_op_bf16.py:102
    B = 16
    lines.append(f"[aiter] shape is B:{B}, M:{M}, N:{N}, K:{K} dtype is bf16, not found tuned config in CKGEMM, "
                 f"will use default config!")
    # fused_moe.py:2461-2463, keys tuple holding a pybind enum
    keys = ("('gfx942', 304, 32, 7168, 2048, 256, 8, <ActivationType.Silu: 0>, 'torch.bfloat16', "
            "'torch.float8_e4m3fnuz', 'torch.float8_e4m3fnuz', 'QuantType.per_Token', True, False)")
    lines.append(f"[aiter] [fused_moe] using 2stage default for {keys} ")
    lines.append("[aiter] [fused_moe] using 2stage (kernelName1='moe_ck2stages_gemm1_256x32', "
                 f"kernelName2='moe_ck2stages_gemm2_256x32') for {keys} ")
    lines.append("INFO 12-02 vllm.engine: unrelated line mentioning shape is nothing")
    return "\n".join(lines)


def test_log_lines_of_every_kind_parse():
    events = parse_log(aiter_lines()).events
    fams = [e.family for e in events]
    assert fams.count("bf16_gemm") == 3 and fams.count("a8w8_gemm") == 1 and fams.count("fmoe") == 2
    assert fams.count("a8w8_blockscale_gemm") == 2 and fams.count("bf16_batched_gemm") == 1
    hit = next(e for e in events if e.family == "bf16_gemm" and e.hit)
    assert hit.shape["M"] == "100" and hit.padded_m == 112 and hit.cu_num == 304 and hit.kernel.startswith("_ZN")
    moe = [e for e in events if e.family == "fmoe"]
    assert moe[0].shape["act_type"] == "ActivationType.Silu" and not moe[0].hit and moe[1].hit
    assert moe[1].kernel == "moe_ck2stages_gemm1_256x32" and moe[0].gfx == "gfx942"


def test_log_capture_counts_lines_and_skips_other_families():
    out = cp.from_log(BF16, aiter_lines(), "gfx942", 304)
    counts = {s.as_dict()["M"]: n for s, n in out.shapes.values()}
    assert counts == {"20": 2, "100": 1}
    assert any("other families" in n for n in out.notes)
    moe = cp.from_log(FAMILIES["fmoe"], aiter_lines(), "gfx942", 304)
    (shape, n), = moe.shapes.values()
    assert n == 2 and shape.as_dict()["use_g1u1"] == "1" and shape.as_dict()["doweight_stage1"] == "0"


def test_log_lines_from_another_gpu_are_not_taken():
    with pytest.raises(ShapeError):
        cp.from_log(FAMILIES["fmoe"], aiter_lines(), "gfx950", 256)


def test_log_lines_are_matched_against_the_lookup_identity_of_the_serving_environment():
    """AITER prints the cu_num its lookup used (get_cu_num(): CU_NUM, tuned_gemm.py:141/:183, fused_moe.py:2225):
    on a 256-CU GPU served with CU_NUM=304 the lines say 304 and belong to this GPU's capture."""
    moe = cp.from_log(FAMILIES["fmoe"], aiter_lines(), "gfx942", 256, env={"CU_NUM": "304"})
    assert sum(n for _, n in moe.shapes.values()) == 2
    bf16 = cp.from_log(BF16, aiter_lines(), "gfx942", 256, env={"CU_NUM": "304"})
    assert {s.as_dict()["M"]: n for s, n in bf16.shapes.values()} == {"20": 2, "100": 1}
    assert sum(n for _, n in cp.from_log(BF16, aiter_lines(), "gfx942", 256).shapes.values()) == 2  # hit skipped
    with pytest.raises(ShapeError):  # the GPU is gfx950: fmoe's lookup keys on get_gfx_runtime(), not GPU_ARCHS
        cp.from_log(FAMILIES["fmoe"], aiter_lines(), "gfx950", 304, env={"GPU_ARCHS": "gfx942"})


@pytest.mark.parametrize("name,family", [
    ("bf16_untuned_gemm.csv", "bf16_gemm"), ("a8w8_untuned_gemm.csv", "a8w8_gemm"),
    ("a8w8_bpreshuffle_untuned_gemm.csv", "a8w8_bpreshuffle_gemm"),  # a line ends in a TAB
    ("a4w4_blockscale_untuned_gemm.csv", "a4w4_blockscale_gemm"), ("untuned_fmoe.csv", "fmoe"),
    ("bf16_untuned_batched_gemm.csv", "bf16_batched_gemm"), ("model_configs/llama70B_untuned_gemm_bf16.csv",
                                                             "bf16_gemm"),
    ("model_configs/kimik3_a8w4_untuned_fmoe.csv", "fmoe"),
])
def test_real_untuned_csvs_parse(name, family):
    text = (CONFIGS / name).read_text()
    rows = [ln for ln in text.splitlines()[1:] if ln.strip()]
    out = cp.from_untuned_csv(FAMILIES[family], text)
    assert sum(n for _, n in out.shapes.values()) == len(rows)
    assert len(out.shapes) <= len(rows)


def test_json_adds_counts_for_the_same_shape():
    out = cp.from_json(BF16, [{"M": 1, "N": 2, "K": 3, "count": 5}, {"M": "1", "N": 2, "K": 3, "bias": "False"}])
    (shape, n), = out.shapes.values()
    assert n == 6 and shape.as_dict()["outdtype"] == "torch.bfloat16"


@pytest.mark.parametrize("shape,field", [
    ({"M": -1, "N": 2, "K": 3}, "shapes[0].M"), ({"M": 1.5, "N": 2, "K": 3}, "shapes[0].M"),
    ({"M": "x", "N": 2, "K": 3}, "shapes[0].M"), ({"N": 2, "K": 3}, "shapes[0].M"),
    ({"M": 1, "N": 2, "K": 3, "dtype": "torch.bf17"}, "shapes[0].dtype"),
    ({"M": 1, "N": 2, "K": 3, "bias": "maybe"}, "shapes[0].bias"),
    ({"M": 1, "N": 2, "K": 3, "Q": 1}, "shapes[0].Q"), ({"M": 1, "N": 2, "K": 3, "count": -2}, "shapes[0].count"),
])
def test_bad_json_shapes_name_the_field(shape, field):
    with pytest.raises(ShapeError) as e:
        cp.from_json(BF16, [shape])
    assert e.value.field == field


def test_untuned_csv_with_wrong_columns_is_refused():
    with pytest.raises(ShapeError) as e:
        cp.from_untuned_csv(FAMILIES["a8w8_gemm"], "M,N,X\n1,2,3\n")
    assert e.value.field == "untuned_csv.header" and "'X'" in str(e.value)
    with pytest.raises(ShapeError) as e:
        cp.from_untuned_csv(BF16, "M,N,K\n1,2\n")
    assert e.value.field == "untuned_csv.line2"


def test_every_log_line_cites_the_aiter_fstring_it_reads():
    """TableFamily.log_lines: the file:line each pattern cites holds an f-string logging that line's start."""
    from app.domain.families import FAMILIES as ALL
    from tests.conftest import aiter_tree_with
    lines = {ll for f in ALL.values() for ll in f.log_lines}
    assert {f.name for f in ALL.values() if f.log_lines} >= {"bf16_gemm", "a8w8_gemm", "fmoe", "fhmoe"}
    for ll in lines:
        path, at = ll.where.split(":")
        src = aiter_tree_with("aiter/" + path) / "aiter" / path
        text = src.read_text().splitlines()[int(at.split("-")[0]) - 1]
        assert 'f"' in text and ll.start in text, (ll.where, text)
