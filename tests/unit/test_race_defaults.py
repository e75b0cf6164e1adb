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
