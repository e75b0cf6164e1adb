"""Issue 35, engagement at the op: four paths AITER's op takes that the model has to follow (each rule cites AITER's
file:line; tests/differential/test_engagement_vs_aiter.py checks the same against AITER's own code)."""

from __future__ import annotations

from app.domain.engagement import check
from app.domain.families import FAMILIES
from app.domain.tables import Table

BF16 = FAMILIES["bf16_gemm"]
# a name FlyDSL's catalog builds today (ops/flydsl/gemm_kernels.py:118-175), and the same kernel as AITER named it
# before ROCm/aiter#3469 added _block_k_warp<n>
FLY_NOW = ("flydsl_gemm2_abf16_wbf16_bf16_t16x64x64_split_k1_block_m_warp1_block_n_warp1_block_k_warp1_"
           "async_copyTrue_b_to_ldsTrue_b_preshuffleFalse_c_to_ldsFalse_gfx950")
FLY_OLD = FLY_NOW.replace("_block_k_warp1", "")


def _bf16_table(rows: list[dict[str, str]]) -> Table:
    header = BF16.tuned_header
    base = dict(gfx="gfx950", cu_num="256", N="1280", K="8192", bias="False", dtype="torch.bfloat16",
                outdtype="torch.bfloat16", scaleAB="False", bpreshuffle="False", solidx="0", splitK="0", us="5.0",
                err_ratio="0", tflops="1", bw="1")
    return Table(header, [{c: {**base, **r}.get(c, "") for c in header} for r in rows])


def _bf16_shape(m: str) -> dict[str, str]:
    return dict(M=m, N="1280", K="8192", bias="False", dtype="torch.bfloat16", outdtype="torch.bfloat16",
                scaleAB="False", bpreshuffle="False")


def test_a_flydsl_row_engages_only_where_aiters_catalog_reads_its_kernel_name():
    """tuned_gemm.py:163-177 asks get_flydsl_splitk_hgemm_kernel_params (gemm_kernels.py:579-586) for a FlyDSL row's
    kernel: a name its regex (:45-65) does not read, an old-format one included, is skipped for the next padded M,
    then the default; a flydsl_ prefix alone is no kernel."""
    kinds = {"1": FLY_NOW, "2": FLY_OLD, "3": FLY_NOW.replace("wbf16", "wf16"), "4": "flydsl_svc"}
    table = _bf16_table([dict(M=m, libtype="flydsl", kernelName=k) for m, k in kinds.items()])
    got = {s["M"]: c for s, c in zip([_bf16_shape(m) for m in kinds],
                                     check(BF16, BF16.key_columns, "gfx950", 256, [_bf16_shape(m) for m in kinds],
                                           table, flydsl=True))}
    assert got["1"].hit and got["1"].row["kernelName"] == FLY_NOW
    for m in ("2", "3", "4"):
        assert not got[m].hit and got[m].verdict == "miss", (m, got[m])
        assert "catalog" in got[m].reason
