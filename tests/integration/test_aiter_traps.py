"""Two of AITER's quieter traps on its real tables: fmoe ignores act_type at run time, and the a8w8 and
batched kernels come from a compiled table that pads M differently from the Python splitK lookup."""

from __future__ import annotations

import csv
import io

import pytest

from app.domain.engagement import check
from app.domain.families import FAMILIES
from app.domain.tables import Table
from tests.conftest import CONFIGS, DIGEST, capture
from tests.integration.test_leasing_api import lease, ok_row, plausible_us, tune_all

FMOE = FAMILIES["fmoe"]


def test_an_fmoe_row_differing_from_a_shipped_one_only_in_act_type_is_shadowed_in_a_layer_first_when_merged(client):
    default = (CONFIGS / "tuned_fmoe.csv").read_text()
    assert client.put(f"/v1/images/{DIGEST}/tables", json={"tables": {"tuned_fmoe.csv": default}}).status_code == 200
    shipped = list(csv.DictReader(io.StringIO(default)))
    keys = {tuple(r[c] for c in FMOE.shape_columns) for r in shipped}

    def silu(r):
        return {c: r[c] for c in FMOE.shape_columns} | {"act_type": "ActivationType.Silu"}
    # a shipped Gelu row whose Silu twin the image does not ship: the twin is what we tune
    s0 = next(r for r in shipped if r["act_type"] == "ActivationType.Gelu"
              and tuple(silu(r)[c] for c in FMOE.shape_columns) not in keys)
    other_act = silu(s0)
    cid = capture(client, [other_act], family="fmoe", gfx="gfx942", cu_num=int(shipped[0]["cu_num"])).json()
    # kernels of the kinds the op's stage launchers run (an asm stage 1, a CK stage 2: fused_moe.py:2935-2975)
    tune_all(client, "gfx942", int(shipped[0]["cu_num"]), kernelName1="_ZN5aiter_mine1E",
             kernelName2="moe_ck2stages_gemm2_mine2", err1="0.0%",
             err2="0.0%", block_m="32", ksplit="0", us1="1", us2="1", run_1stage="0", _tag="")
    # AITER's merge keys on act_type, so the layer loads; its lookup ignores act_type: the shipped twin wins
    assert client.get(f"/v1/overlays/{DIGEST}/fmoe.csv", params={"version": "latest"}).status_code == 200
    layer = client.get(f"/v1/campaigns/{cid['campaign_id']}/engagement", params={"form": "layer"}).json()
    assert layer["hits"] == 1 and layer["report"][0]["kernel"] == s0["kernelName1"]
    merged = client.get(f"/v1/overlays/{DIGEST}/fmoe.csv", params={"version": "latest", "merged": True}).text
    rows = list(csv.DictReader(io.StringIO(merged)))
    mine = next(i for i, x in enumerate(rows) if x["kernelName1"] == "_ZN5aiter_mine1E")
    twin = next(i for i, x in enumerate(rows) if all(x[c] == s0[c] for c in FMOE.shape_columns))
    assert mine < twin, "in the merged file the overlay's row comes first, so AITER's first-match picks it"
    eng = client.get(f"/v1/campaigns/{cid['campaign_id']}/engagement", params={"merged": True}).json()
    assert eng["hits"] == 1 and eng["report"][0]["kernel"] == "_ZN5aiter_mine1E"


def test_fmoe_engagement_is_first_match_across_act_type():
    row = {c: "1" for c in FMOE.tuned_header} | {"gfx": "gfx942", "cu_num": "80", "token": "32",
                                                 "act_type": "ActivationType.Gelu", "dtype": "torch.bfloat16",
                                                 "q_dtype_a": "torch.bfloat16", "q_dtype_w": "torch.bfloat16",
                                                 "q_type": "QuantType.No", "kernelName1": "_ZN5aiter_geluE"}
    # 1-stage rows (run_1stage 1) of asm kernels, which fused_moe_1stage runs (fused_moe.py:2493-2517)
    table = Table(FMOE.tuned_header, [row, dict(row, act_type="ActivationType.Silu", kernelName1="_ZN5aiter_siluE")])
    shape = {c: row[c] for c in FMOE.shape_columns} | {"act_type": "ActivationType.Silu"}
    (res,) = check(FMOE, FMOE.key_columns, "gfx942", 80, [shape], table)
    assert res.hit and res.row["kernelName1"] == "_ZN5aiter_geluE"  # what AITER picks for a Silu call


def test_a8w8_python_and_compiled_lookups_must_agree():
    """M=100 with rows at 112 and 128: Python takes splitK from 112 (gl0), C++ the kernel from 128."""
    fam = FAMILIES["a8w8_gemm"]
    base = {"gfx": "gfx950", "cu_num": "256", "N": "1280", "K": "8192", "q_dtype_w": "torch.int8", "kernelId": "1",
            "splitK": "0", "us": "5", "kernelName": "k", "tflops": "1", "bw": "1", "errRatio": "0"}
    table = Table(fam.tuned_header, [dict(base, M="112", splitK="2"),
                                     dict(base, M="128", kernelName="k128", kernelId="2")])
    shape = {"M": "100", "N": "1280", "K": "8192", "q_dtype_w": "torch.int8"}
    (res,) = check(fam, fam.key_columns, "gfx950", 256, [shape], table)
    assert not res.hit and "M=112" in res.reason and "M=128" in res.reason
    (ok,) = check(fam, fam.key_columns, "gfx950", 256, [dict(shape, M="128")], table)
    assert ok.hit
    # the compiled table ignores q_dtype_w: an fp8 row after the int8 one wins the kernel for both
    fp8 = Table(fam.tuned_header, [dict(base, M="128"),
                                   dict(base, M="128", q_dtype_w="torch.float8_e4m3fn", kernelId="2")])
    (clash,) = check(fam, fam.key_columns, "gfx950", 256, [dict(shape, M="128")], fp8)
    assert not clash.hit and "q_dtype_w" in clash.reason


A8W8_ROW = {"cu_num": "0", "M": "128", "N": "1280", "K": "8192", "kernelId": "1", "splitK": "0", "us": "5",
            "kernelName": "k", "tflops": "1", "bw": "1", "errRatio": "0"}


@pytest.mark.parametrize("gfx,cu,weight", [("gfx942", 304, "torch.float8_e4m3fn"),
                                           ("gfx950", 256, "torch.float8_e4m3fnuz")])
def test_a8w8_ck_looks_up_a_weight_not_the_gpus_own_fp8_as_int8(gfx, cu, weight):
    """gemm_a8w8_CK (gemm_op_a8w8.py:663) looks up any weight dtype but the GPU's own fp8 and int8 as torch.int8:
    a row keyed on the captured dtype is never found, the int8 row is."""
    fam = FAMILIES["a8w8_gemm"]
    base = dict(A8W8_ROW, gfx=gfx, cu_num=str(cu))
    shape = {"M": "128", "N": "1280", "K": "8192", "q_dtype_w": weight}
    (res,) = check(fam, fam.key_columns, gfx, cu, [shape], Table(fam.tuned_header, [dict(base, q_dtype_w=weight)]))
    assert not res.hit and "torch.int8" in res.reason
    int8 = Table(fam.tuned_header, [dict(base, q_dtype_w="torch.int8", kernelName="int8_row")])
    (res,) = check(fam, fam.key_columns, gfx, cu, [shape], int8)
    assert res.hit and res.row["kernelName"] == "int8_row"
    # the GPU's own fp8 is looked up as it is
    own = "torch.float8_e4m3fnuz" if gfx == "gfx942" else "torch.float8_e4m3fn"
    (res,) = check(fam, fam.key_columns, gfx, cu, [dict(shape, q_dtype_w=own)], int8)
    assert not res.hit


def test_an_a8w8_row_tuned_on_a_foreign_fp8_weight_is_keyed_as_the_op_looks_it_up(client):
    """A float8_e4m3fn weight captured on gfx942: the tuner writes the row on fn, the op looks up int8; the
    overlay carries it keyed int8, and the engagement report predicts the hit AITER makes."""
    shape = {"M": 128, "N": 1280, "K": 8192, "q_dtype_w": "torch.float8_e4m3fn"}
    cid = capture(client, [shape], family="a8w8_gemm", gfx="gfx942", cu_num=304).json()["campaign_id"]
    tune_all(client, "gfx942", 304, kernelId="1", splitK="0", kernelName="mine", tflops="1", bw="1", errRatio="0")
    rows = list(csv.DictReader(io.StringIO(client.get(f"/v1/overlays/{DIGEST}/a8w8_gemm.csv", params={"version": "latest"}).text)))
    assert [(r["q_dtype_w"], r["kernelName"]) for r in rows] == [("torch.int8", "mine")]
    rep = client.get(f"/v1/campaigns/{cid}/engagement", params={"form": "merged"}).json()
    assert rep["hits"] == 1 and rep["report"][0]["kernel"] == "mine", rep["report"]


@pytest.mark.parametrize("gfx,cu", [("gfx950", 256), ("gfx942", 304)])
def test_bf16_bpreshuffle_without_a_row_raises_where_aiter_has_no_default(client, gfx, cu):
    """tuned_gemm.py:191-210: a bpreshuffle call without a row asserts "no solution" off gfx942 unless the asm
    default fits (bf16 in, N and K multiples of 64, bf16/fp32 out): a third verdict, counted and shown."""
    base = {"N": 1280, "K": 8192, "bias": False, "dtype": "torch.bfloat16", "outdtype": "torch.bfloat16",
            "scaleAB": False, "bpreshuffle": True}
    shapes = [dict(base, M=7), dict(base, M=9, N=1288), dict(base, M=11, outdtype="torch.float16"),
              dict(base, M=13, bpreshuffle=False, N=1288)]
    cid = capture(client, shapes, family="bf16_gemm", gfx=gfx, cu_num=cu).json()["campaign_id"]
    rep = client.get(f"/v1/campaigns/{cid}/engagement").json()
    by_m = {r["shape"]["M"]: r for r in rep["report"]}
    want = {"7": "miss", "9": "raises", "11": "raises", "13": "miss"} if gfx == "gfx950" else dict.fromkeys(
        ("7", "9", "11", "13"), "miss")  # gfx942's default is hipBLASLt (tuned_gemm.py:194-197)
    assert {m: r["verdict"] for m, r in by_m.items()} == want
    n = sum(v == "raises" for v in want.values())
    assert (rep["hits"], rep["misses"], rep["raises"]) == (0, 4 - n, n)
    if n:
        assert "tuned_gemm.py:208" in by_m["9"]["reason"] and not by_m["9"]["hit"]
    page = client.get(f"/campaigns/{cid}").text
    assert (f"AITER raises on {n} of them" in page) == bool(n)
    assert page.count('<td class="verdict state-failed">raises</td>') == n


FMOE_SHAPE = {"token": 32, "model_dim": 7168, "inter_dim": 256, "expert": 256, "topk": 8,
              "act_type": "ActivationType.Silu", "dtype": "torch.bfloat16", "q_dtype_a": "torch.float8_e4m3fnuz",
              "q_dtype_w": "torch.float8_e4m3fnuz", "q_type": "QuantType.per_1x128", "use_g1u1": 1,
              "doweight_stage1": 0}
# an asm 1-stage kernel (fused_moe_1stage runs asm names: a name it does not know raises, asm_fmoe.cu:320)
FMOE_CELLS = dict(block_m="32", ksplit="0", us1="1", kernelName1="_ZN5aiter_svc1E", err1="0.0%", us2="0",
                  kernelName2="",
                  err2="0.0%", run_1stage="1", xbf16="0", flat="0", tflops="1", bw="1")


def test_a_row_aiter_could_not_parse_is_refused_naming_the_cell(client):
    """fused_moe.py:2437-2449 int()s xbf16 and flat of a 1-stage row (an empty cell is NaN: ValueError); a 2-stage
    row's are never read. A worker's result and a CSV posted for checking are refused (422, the cell named),
    nothing predicted on them."""
    shapes = [dict(FMOE_SHAPE, token=t) for t in (32, 64, 128)]
    cid = capture(client, shapes, family="fmoe", gfx="gfx942", cu_num=304).json()["campaign_id"]
    body = lease(client, budget_s=80_000, gfx="gfx942", cu_num=304).json()
    for item, (cell, val) in zip(body["shapes"], (("xbf16", ""), ("flat", ""), ("block_m", "big"))):
        res = client.post(f"/v1/leases/{body['lease_id']}/results", json=ok_row(
            body, item, plausible_us(body, item, 5.0), **dict(FMOE_CELLS, **{cell: val})))
        assert res.status_code == 422 and res.json()["field"] == f"row.{cell}", res.text
        assert "fused_moe.py:24" in res.json()["detail"]
    assert client.get(f"/v1/overlays/{DIGEST}/fmoe.csv", params={"version": "latest"}).text.count("\n") <= 1  # nothing stored as a row
    # a 2-stage row's xbf16 and flat are never read: taken
    body = lease(client, budget_s=80_000, gfx="gfx942", cu_num=304).json()
    for item in body["shapes"]:
        ok = client.post(f"/v1/leases/{body['lease_id']}/results", json=ok_row(
            body, item, plausible_us(body, item, 5.0),
            **dict(FMOE_CELLS, run_1stage="0", kernelName2="moe_ck2stages_gemm2_svc2", xbf16="", flat="")))
        assert ok.status_code == 200, ok.text
    header = list(FMOE_CELLS) + ["gfx", "cu_num"] + list(FMOE_SHAPE)
    row = {**{k: str(v) for k, v in FMOE_SHAPE.items()}, **FMOE_CELLS, "gfx": "gfx942", "cu_num": "304",
           "xbf16": ""}
    text = ",".join(header) + "\n" + ",".join(row[c] for c in header) + "\n"
    res = client.post(f"/v1/campaigns/{cid}/engagement", content=text, headers={"content-type": "text/csv"})
    assert res.status_code == 422 and res.json()["field"] == "body.rows.0.xbf16", res.text
    row["xbf16"] = "1"
    text = ",".join(header) + "\n" + ",".join(row[c] for c in header) + "\n"
    res = client.post(f"/v1/campaigns/{cid}/engagement", content=text, headers={"content-type": "text/csv"})
    assert res.status_code == 200 and res.json()["hits"] == 1, res.text


def test_a_shipped_one_stage_row_without_xbf16_is_predicted_to_raise():
    fam = FAMILIES["fmoe"]
    shape = {k: str(v) for k, v in FMOE_SHAPE.items()}
    row = {**shape, **FMOE_CELLS, "gfx": "gfx942", "cu_num": "304", "xbf16": ""}
    (res,) = check(fam, fam.key_columns, "gfx942", 304, [shape], Table(tuple(row), [row]))
    assert res.verdict == "raises" and "xbf16" in res.reason
    (res,) = check(fam, fam.key_columns, "gfx942", 304, [shape], Table(tuple(row), [dict(row, xbf16="0")]))
    assert res.verdict == "hit"


def test_a_proof_agrees_only_on_every_shape_probed_with_the_row_predicted(client):
    """A proof that stopped (AITER raised resolving the table) or left shapes out is not agreement: a raise or
    an unprobed shape is a disagreement, and a hit on another row or kernel than predicted is one."""
    shapes = [{"M": m, "N": 1280, "K": 8192} for m in (16, 32, 64)]
    cid = capture(client, shapes, family="bf16_gemm", gfx="gfx942", cu_num=304).json()["campaign_id"]
    tune_all(client, "gfx942", 304)
    rep = client.get(f"/v1/campaigns/{cid}/engagement").json()
    assert rep["hits"] == 3
    form = rep["form"]

    def prove(results, error=None):
        r = client.post(f"/v1/campaigns/{cid}/engagement/proofs", json={
            "form": form, "worker_id": "w", "error": error, "results": results})
        assert r.status_code == 201, r.text
        return client.get(f"/v1/campaigns/{cid}/engagement").json()

    good = [{"shape_id": r["shape_id"], "hit": True, "kernel": r["kernel"]} for r in rep["report"]]
    assert prove(good)["proof"]["disagreements"] == 0
    assert "agrees with the prediction on every shape" in client.get(f"/campaigns/{cid}").text
    got = prove([], error="ValueError: DataFrame index must be unique")
    assert got["proof"]["disagreements"] == 3 and all(r["disagrees"] for r in got["report"])
    assert "agrees with the prediction" not in client.get(f"/campaigns/{cid}").text
    assert prove(good[:1])["proof"]["disagreements"] == 2  # two shapes never probed
    raised = [dict(good[0], hit=False, kernel=None, raised="AssertionError: no solution")] + good[1:]
    got = prove(raised)
    assert got["proof"]["disagreements"] == 1 and got["report"][0]["proved_verdict"] == "raises"
    other = [dict(good[0], kernel="not_ours")] + good[1:]
    assert prove(other)["proof"]["disagreements"] == 1
    row = [dict(g, row={"kernelName": g["kernel"], "us": "0.5"}) for g in good]  # not our row's us
    assert prove(row)["proof"]["disagreements"] == 3


def test_the_deploy_plan_says_a_torch_backend_row_is_served_by_aiters_own_kernel(client):
    """tuned_gemm.py:415-451 runs a libtype=torch row as plain F.linear, :584-602 a libtype=triton row with AITER's
    own Triton kernel: the torch backend's race of a pre-transposed matmul or of this project's Triton configs
    does not carry into the served path, and the plan says so for those rows."""
    capture(client, [{"M": m, "N": 1280, "K": 8192} for m in (16, 32)], gfx="gfx942", cu_num=304)
    tune_all(client, "gfx942", 304, kernelName="torch_mm_bt_contig")  # ok_row's backend: torch, libtype torch
    notes = client.get(f"/v1/overlays/{DIGEST}/bf16_gemm/deploy").json()["notes"]
    (note,) = [n for n in notes if "torch backend" in n]
    assert "2 row(s)" in note and "F.linear" in note and "does not carry" in note


def test_a_bpreshuffle_miss_a_padded_weight_could_turn_into_a_hit_is_reported_unknown(client):
    """Issue 35: gemm_a8w8_bpreshuffle looks a miss up again at a padded weight's K (ops/gemm_op_a8w8.py:711-742);
    a capture carries the activation's K only, so the report says what the verdict depends on instead of a miss,
    in its totals, per shape and on the campaign page."""
    fam, fp8 = "a8w8_bpreshuffle_gemm", "torch.float8_e4m3fn"
    cid = capture(client, [{"M": 32, "N": 1024, "K": 7168, "q_dtype_w": fp8}], family=fam, gfx="gfx950",
                  cu_num=256).json()["campaign_id"]
    tune_all(client, "gfx950", 256, libtype="cktile", kernelId=1, kernelName="a8w8_bpreshuffle_cktile_svc",
             errRatio=0.0)
    capture(client, [{"M": 32, "N": 1024, "K": 7040, "q_dtype_w": fp8}], family=fam, gfx="gfx950", cu_num=256)
    eng = client.get(f"/v1/campaigns/{cid}/engagement").json()
    by_k = {r["shape"]["K"]: r for r in eng["report"]}
    assert by_k["7168"]["verdict"] == "hit", by_k["7168"]
    assert by_k["7040"]["verdict"] == "unknown" and not by_k["7040"]["hit"], by_k["7040"]
    assert "depends on the weight's K" in by_k["7040"]["reason"] and "gemm_op_a8w8.py:711-742" in by_k["7040"]["reason"]
    assert (eng["hits"], eng["misses"], eng["unknown"]) == (1, 0, 1)
    page = client.get(f"/campaigns/{cid}").text
    assert 'id="unknown"' in page and ">unknown<" in page


def test_the_fmoe_verdict_reads_the_servers_environment_from_the_capture(client):
    """Issue 35: the MoE op reads its bounds from the server's environment (fused_moe.py:76, 768, 776-803), which a
    capture carries in env: a bound int() rejects makes every call raise, and the report says so."""
    shape = {"token": 100, "model_dim": 4096, "inter_dim": 512, "expert": 128, "topk": 8,
             "act_type": "ActivationType.Swiglu", "dtype": "torch.bfloat16", "q_dtype_a": "torch.float4_e2m1fn_x2",
             "q_dtype_w": "torch.float4_e2m1fn_x2", "q_type": "QuantType.per_1x32", "use_g1u1": 1,
             "doweight_stage1": 0}
    cid = capture(client, [shape], family="fmoe", gfx="gfx950", cu_num=256).json()["campaign_id"]
    (row,) = client.get(f"/v1/campaigns/{cid}/engagement").json()["report"]
    assert row["verdict"] == "miss", row
    capture(client, [shape], family="fmoe", gfx="gfx950", cu_num=256, env={"AITER_BF16_FP8_MOE_BOUND": "x"})
    (row,) = client.get(f"/v1/campaigns/{cid}/engagement").json()["report"]
    assert row["verdict"] == "raises" and "fused_moe.py:768" in row["reason"], row
