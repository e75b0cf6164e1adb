"""The worker reads the image's AITER tables with pandas, as AITER loads them."""

from __future__ import annotations

import shutil

from tests.conftest import CONFIGS
from workers import image_tables


def test_a_table_aiter_cannot_load_is_not_reported(tmp_path, caplog):
    configs = tmp_path / "configs"
    configs.mkdir()
    shutil.copy(CONFIGS / "bf16_tuned_gemm.csv", configs)
    # a row with more cells than the header: pandas.read_csv (so AITER) raises on it
    (configs / "a8w8_tuned_gemm.csv").write_text("gfx,cu_num,M\ngfx942,304,1\ngfx942,304,2,9,9\n")
    (configs / "asm_a8w8_gemm.csv").write_text("not,a,tuned,table\n")
    tables = image_tables.read_tables(configs)
    assert list(tables) == ["bf16_tuned_gemm.csv"]
    assert tables["bf16_tuned_gemm.csv"] == (CONFIGS / "bf16_tuned_gemm.csv").read_text()
    assert "a8w8_tuned_gemm.csv: AITER cannot load it" in caplog.text
