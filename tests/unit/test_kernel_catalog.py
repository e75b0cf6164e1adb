"""The torch backend's kernel catalog (what a worker reports for its image, what the service holds winners to)
names every candidate a real race posts, Triton's too, on a machine without Triton."""

from __future__ import annotations

from tests.unit.test_torch_backend import lease_for, run
from workers.backends.torch_race import DEFAULT, TorchBackend


def test_every_raced_candidate_and_the_winner_are_in_the_catalog():
    backend = TorchBackend(repeats=3)
    catalog = set(backend.kernel_catalog()["bf16_gemm"])
    assert DEFAULT in catalog and any(n.startswith("triton_gemm_") for n in catalog)
    results = run(backend, lease_for((8, 256, 512, False), (16, 64, 64, True)))
    for res in results:
        assert res.status in ("ok", "default_best"), res.error
        names = {c["name"] for c in res.candidates}
        assert names <= catalog and res.kernel_name in catalog
        # the default's time is one of the posted candidates' (the service refuses a default_us that is not)
        assert res.default_us in {c["us"] for c in res.candidates}
