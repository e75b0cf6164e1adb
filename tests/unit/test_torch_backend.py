"""The torch backend races real kernels on the CPU: checks, negative control, failures never win."""

from __future__ import annotations

import time

import pytest
import torch

from app.domain.families import FAMILIES
from workers.backends import torch_race
from workers.backends.base import Batch
from workers.backends.torch_race import TorchBackend, err_ratio

HEADER = list(FAMILIES["bf16_gemm"].tuned_header)


def lease_for(*shapes):
    items = []
    for i, (m, n, k, bias) in enumerate(shapes):
        items.append({"shape_id": i + 1, "shape": {"M": str(m), "N": str(n), "K": str(k), "bias": str(bias),
                                                   "dtype": "torch.bfloat16", "outdtype": "torch.bfloat16",
                                                   "scaleAB": "False", "bpreshuffle": "False"}})
    return {"gfx": "cpu", "cu_num": 2, "tuned_header": HEADER, "shapes": items, "family": "bf16_gemm"}


def run(backend, lease, budget=60.0, stop=lambda: False):
    out = []
    backend.run(Batch(lease, time.monotonic() + budget, stop), out.append)
    return out


def test_races_real_kernels_and_emits_a_row_in_the_tuned_schema():
    (res,) = run(TorchBackend(repeats=5), lease_for((16, 256, 512, True)))
    assert res.status == "ok", res.error
    names = {c["name"] for c in res.candidates}
    assert {"torch_linear", "torch_addmm_out", "torch_splitk2_fp32acc"} <= names
    assert res.us == min(c["us"] for c in res.candidates if c["us"] is not None and c["err_ratio"] <= 0.05)
    assert res.err_ratio <= 0.05 and res.default_us is not None
    assert list(res.row) == HEADER
    assert res.row["kernelName"] == res.kernel_name and float(res.row["us"]) > 0 and res.row["bias"] == "True"


def test_the_error_check_sees_a_shifted_output():
    ref = torch.randn(8, 8, dtype=torch.float64)
    assert err_ratio(ref.to(torch.bfloat16), ref, torch.bfloat16) < 0.05
    assert err_ratio((ref + 0.5 * (1 + ref.abs())).to(torch.bfloat16), ref, torch.bfloat16) == 1.0


def test_wrong_raising_and_slow_kernels_never_win(monkeypatch):
    real = torch_race.candidates

    def rigged(a, b, bias, out_dtype):
        zeros = torch.zeros(a.shape[0], b.shape[0], dtype=out_dtype)

        def slow():
            time.sleep(0.3)
            return zeros
        return real(a, b, bias, out_dtype) + [
            torch_race.Candidate("wrong_but_fast", "torch", 0, lambda: zeros),
            torch_race.Candidate("raises", "torch", 0, lambda: (_ for _ in ()).throw(RuntimeError("bad kernel"))),
            torch_race.Candidate("too_slow", "torch", 0, slow)]

    monkeypatch.setattr(torch_race, "candidates", rigged)
    (res,) = run(TorchBackend(repeats=3, candidate_limit_s=0.2), lease_for((8, 128, 256, False)))
    by = {c["name"]: c for c in res.candidates}
    assert res.status == "ok" and res.kernel_name not in ("wrong_but_fast", "raises", "too_slow")
    assert by["wrong_but_fast"]["err_ratio"] > 0.05
    assert "bad kernel" in by["raises"]["error"] and "limit" in by["too_slow"]["error"]


def test_no_passing_candidate_fails_the_shape(monkeypatch):
    monkeypatch.setattr(torch_race, "candidates", lambda a, b, bias, d: [
        torch_race.Candidate("wrong", "torch", 0, lambda: torch.zeros(a.shape[0], b.shape[0], dtype=d))])
    (res,) = run(TorchBackend(repeats=2), lease_for((4, 64, 64, False)))
    assert res.status == "failed" and res.row is None and "error check" in res.error


def test_a_stop_abandons_the_shape_and_an_unsupported_shape_fails():
    assert run(TorchBackend(repeats=2), lease_for((4, 64, 64, False)), stop=lambda: True) == []
    lease = lease_for((4, 64, 64, False))
    lease["shapes"][0]["shape"]["scaleAB"] = "True"
    (res,) = run(TorchBackend(repeats=2), lease)
    assert res.status == "failed" and "scaleAB" in res.error


@pytest.mark.parametrize("budget", [0.0])
def test_no_work_starts_past_the_budget(budget):
    assert run(TorchBackend(repeats=2), lease_for((4, 64, 64, False), (4, 64, 64, True)), budget=budget) == []


def test_a_shape_that_hits_the_budget_ends_its_race_early():
    lease = lease_for((16, 256, 512, False))
    full = run(TorchBackend(repeats=3), lease)[0]
    class RunsOut(Batch):
        """Inside the budget when the shape starts, past it from the first candidate on."""
        calls = 0

        def time_left(self):
            self.calls += 1
            return 1.0 if self.calls == 1 else -1.0

    out = []
    TorchBackend(repeats=3).run(RunsOut(lease, 0.0, lambda: False), out.append)
    (res,) = out
    assert res.status == "ok" and len(res.candidates) < len(full.candidates)
