"""Served-steps weights from a tokens-per-step histogram (app/domain/served.py)."""

from __future__ import annotations

import pytest

from app.domain.families import FAMILIES
from app.domain.roofline import estimate_us
from app.domain.served import HistogramError, canon, fold_covered, merge, priority, step_weights

BF16 = FAMILIES["bf16_gemm"]
# a decode-heavy vLLM server: 90% of engine steps carry one token
HIST = {"1": 900, "8": 50, "16": 20, "32": 10, "64": 5, "128": 5, "256": 3, "512": 2, "1024": 2, "2048": 1,
        "4096": 1, "8192": 1, "+Inf": 0}


def sh(m, n=8192, k=8192):
    return {"M": str(m), "N": str(n), "K": str(k)}


def test_a_decode_shape_outranks_a_4096x_heavier_prefill_shape():
    decode, prefill = sh(1, 1280, 8192), sh(4096, 8192, 8192)
    w = step_weights(BF16, [decode, prefill], HIST)
    assert w == [900.0, 1.0]  # each gets its own bucket's steps, not all steps up to its M
    us = [estimate_us(BF16, x, "gfx942", 304) for x in (decode, prefill)]
    assert priority(1, w[0], us[0]) > 10 * priority(1, w[1], us[1])
    assert priority(1, None, us[0]) < priority(1, None, us[1])  # by calls alone the prefill shape wins


def test_ms_in_one_bucket_split_it_by_the_next_smaller_captured_m():
    w = step_weights(BF16, [sh(4), sh(8), sh(9), sh(16), sh(4, 64, 64)], HIST)
    assert w[0] == pytest.approx(50 * 3 / 7)  # T in 2..4 of bucket (1, 8]
    assert w[1] == pytest.approx(50 * 4 / 7)  # T in 5..8
    assert w[2] == pytest.approx(20 / 8) and w[3] == pytest.approx(20 * 7 / 8)  # T 9 | T 10..16
    assert w[4] == w[0]  # another (N, K) group has its own split
    assert sum(w[:4]) == pytest.approx(70)


def test_no_m_column_means_every_step_and_inf_bucket_is_bounded():
    assert step_weights(FAMILIES["gdn_k5_opt"], [{"H": "1"}], {"1": 5, "+Inf": 5}) == [10.0]
    w = step_weights(BF16, [sh(10000), sh(20000)], {"8192": 0, "+Inf": 10})
    assert w[0] + w[1] == pytest.approx(10)


def test_merge_adds_deltas_and_refuses_bad_buckets():
    assert merge({"1": 2}, {"1.0": 3, "+Inf": 1}) == {"1": 5.0, "+Inf": 1.0}
    assert canon("8.0") == "8" and canon("+Inf") == "+Inf"
    for bad in ({"x": 1}, {"1": -1}, {"0": 1}):
        with pytest.raises(HistogramError):
            merge(None, bad)


def test_a_bucket_row_carries_the_steps_of_the_ms_it_serves():
    shapes = [sh(9), sh(12), sh(16), sh(9, 64, 64)]
    w = step_weights(BF16, shapes, HIST)
    # M=9 and M=12 parked as covered by the row at M=16 (getPaddedM(9..16, gl0) = 16, gemm_common.cu)
    folded = fold_covered(BF16, shapes, w, [True, True, False, True])
    assert folded[2] == pytest.approx(20) and folded[:2] == w[:2]
    assert folded[3] == w[3]  # its group has no row: nothing to carry it
