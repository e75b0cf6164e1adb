"""One settings object for the worker: flags over the environment over defaults; the pool writes the same names."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from workers.pool import PoolConfig, container_kwargs
from workers.settings import WorkerSettings

DIGEST = "sha256:" + "a" * 64


def test_flags_override_the_environment_which_overrides_defaults():
    env = {"TUNER_BUDGET_S": "12", "TUNER_BACKEND": "torch", "AITER_ROOT": "/opt/aiter", "TUNER_ONCE": "true"}
    s = WorkerSettings.load({"budget_s": 5.0, "worker_id": None}, env)
    assert (s.budget_s, s.backend, s.aiter_root, s.once, s.poll_s) == (5.0, "torch", "/opt/aiter", True, 5.0)
    assert WorkerSettings.load({}, {}).service_url == "http://127.0.0.1:8000"


def test_a_bad_environment_value_names_its_setting():
    with pytest.raises(ValidationError, match="gpu"):
        WorkerSettings.load({}, {"TUNER_GPU": "first"})


def test_a_pool_container_environment_reads_back_as_the_same_settings():
    cfg = PoolConfig("p1", "rocm/vllm:x", "http://svc:8000", [3], budget_s=90, backend="torch", token_file="tok",
                     once=True)
    env = container_kwargs(cfg, 3, DIGEST)["environment"]
    s = WorkerSettings.load({}, env)
    assert (s.service_url, s.image_digest, s.budget_s, s.backend, s.worker_id, s.gpu, s.token_file, s.once) == \
        ("http://svc:8000", DIGEST, 90.0, "torch", "p1-gpu3", 0, "/run/secrets/aiter-tuner-token", True)
