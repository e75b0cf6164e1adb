"""The halving race is what a worker runs unless told otherwise, in both backends (issue 14)."""

from __future__ import annotations

import pytest

from workers.cli import make_backend
from workers.settings import WorkerSettings


@pytest.fixture(autouse=True)
def _no_worker_env(monkeypatch):
    monkeypatch.delenv("TUNER_RACE", raising=False)


def test_halving_is_the_default_race_of_both_backends(tmp_path):
    torch_backend = make_backend(WorkerSettings(backend="torch"), "cpu")
    aiter_backend = make_backend(WorkerSettings(backend="aiter", aiter_root=str(tmp_path)), "cpu")
    assert torch_backend.kind == "halving" and aiter_backend.two_phase


def test_exhaustive_is_there_when_asked_for(tmp_path):
    assert make_backend(WorkerSettings(backend="torch", race="exhaustive"), "cpu").kind == "exhaustive"
    assert not make_backend(WorkerSettings(backend="aiter", race="exhaustive", aiter_root=str(tmp_path)),
                            "cpu").two_phase


def test_the_shipped_halving_screens_eagerly_and_keeps_a_bounded_number():
    """Issue 28: every round has a cap on its survivors (the noise band alone kept 25-29 of 59), and round 1
    times eager calls (a graph is captured only for a survivor)."""
    sch = make_backend(WorkerSettings(backend="torch"), "cpu").schedule
    assert sch.eager_screen and all(cap <= 10 for _, _, cap in sch.rounds)
    assert sch.tie_cap <= 0.05 and sch.confirm < sch.final


@pytest.mark.parametrize("race", ["halving", "exhaustive"])
def test_a_carried_shape_gets_a_confirmation_race_whatever_the_workers_race(race):
    """Issue 24: a lease shape with finalists is confirmed (default + incumbent + finalists), by a halving and
    an exhaustive worker alike; one without them gets the worker's own race."""
    import time

    from workers.backends.base import Batch
    backend = make_backend(WorkerSettings(backend="torch", race=race), "cpu")
    shape = {"M": "4", "N": "64", "K": "256", "bias": "False", "dtype": "torch.bfloat16",
             "outdtype": "torch.bfloat16", "scaleAB": "False", "bpreshuffle": "False"}
    lease = {"gfx": "cpu", "cu_num": 1, "tuned_header": ["M"], "shapes": []}
    batch = Batch(lease, time.monotonic() + 60, lambda: False)
    carried = backend.tune(batch, {"shape_id": 1, "shape": shape, "incumbent": "torch_mm_bt_contig",
                                   "finalists": ["torch_mm_bt_contig", "torch_splitk2_fp32acc"]})
    assert carried.race["kind"] == "confirm"
    assert {c["name"] for c in carried.candidates} == {"torch_linear", "torch_mm_bt_contig", "torch_splitk2_fp32acc"}
    fresh = backend.tune(batch, {"shape_id": 2, "shape": shape, "incumbent": "torch_mm_bt_contig"})
    assert fresh.race["kind"] == race and len(fresh.candidates) == 4
