"""Issue 50, on the CPU with real kernels: the race holds no more device memory than its plan, runs in groups where
its candidates do not fit at once, and an out-of-memory is a failed candidate or a failed shape with the reason,
never an exception out of the race."""

from __future__ import annotations

import torch

from workers.backends import torch_race
from workers.backends.torch_candidates import graph_bytes
from workers.backends.torch_memory import GIB, RaceMemory
from workers.backends.torch_race import DEFAULT, TorchBackend

from tests.unit.test_torch_backend import lease_for, run

SHAPE = (16, 128, 256, False)


def oom(what: str = "2.00 GiB") -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {what}\nmore detail")


def _buffered(names, nbytes, held, calls=None, fail_on=None):
    """Candidates that keep a buffer between calls (as a Triton split-K config does): made on the first call,
    freed by release; `held` is the set of names whose buffer exists now, its high-water mark in held["max"]."""
    def one(name, a, b, bias, d):
        box = []

        def fn():
            if calls is not None:
                calls[name] = calls.get(name, 0) + 1
                if fail_on and fail_on.get(name) == calls[name]:
                    raise oom()
            if not box:
                box.append(torch.nn.functional.linear(a, b, bias).to(d))
                held["now"].add(name)
                held["max"] = max(held["max"], len(held["now"]))
            return box[0].clone()

        def release():
            box.clear()
            held["now"].discard(name)
        return torch_race.Candidate(name, "torch", 0, fn, nbytes, release)
    return lambda a, b, bias, d: [one(n, a, b, bias, d) for n in names]


def _fixed():
    m, n, k, bias = SHAPE
    return RaceMemory.fixed(m, n, k, 2, bias)


def test_candidates_that_do_not_fit_at_once_are_raced_in_groups_under_the_stated_bound(monkeypatch):
    """Eight candidates of 1 MiB each and room for three at once: no more than three buffers exist at any time
    (screen, rounds, every capture window), the race still picks among all eight, and the result states the
    bound it planned, under the cap. Without the groups (_held) all eight are held at once (checked: max 8)."""
    names = [DEFAULT] + [f"k{i}" for i in range(7)]
    held = {"now": set(), "max": 0}
    monkeypatch.setattr(torch_race, "candidates", _buffered(names, 1 << 20, held))
    cap = _fixed() + RaceMemory.MARGIN + 3 * (1 << 20) + 1000
    backend = TorchBackend(repeats=6, mem_cap_bytes=cap)
    (res,) = run(backend, lease_for(SHAPE))
    assert res.status in ("ok", "default_best"), res.error
    assert held["max"] == 3 and not held["now"], held
    assert all(c["error"] is None for c in res.candidates) and len(res.candidates) == 8
    mem = res.race["memory"]
    assert mem["bound_gib"] * GIB <= cap - RaceMemory.MARGIN and mem["fixed_gib"] * GIB == _fixed()
    # and the exhaustive race: each candidate prepared alone, its final windows in groups
    held.update(now=set(), max=0)
    (res,) = run(TorchBackend(repeats=6, mem_cap_bytes=cap, race="exhaustive"), lease_for(SHAPE))
    assert res.status in ("ok", "default_best") and held["max"] == 3, (res.error, held)
    assert sum(c["final"] for c in res.candidates) == 8


def test_unbounded_the_race_holds_its_finalists_together():
    """The control for the test above: no cap on the CPU, one group (the plan is the fixed part and all)."""
    plan = RaceMemory(torch.device("cpu")).plan(*SHAPE[:3], 2, False)
    assert plan.budget == float("inf")
    items = [torch_race.Candidate(f"c{i}", "torch", 0, lambda: None, 1 << 20) for i in range(8)]
    assert len(RaceMemory.groups(items, plan.budget)) == 1 and len(RaceMemory.groups(items, 3 << 20)) == 3


def test_a_shape_whose_inputs_and_reference_do_not_fit_is_not_raced_with_the_reason(monkeypatch):
    """Nothing is called: the reason names what the shape holds and what was free. Guards the plan's check in
    tune()."""
    calls = {}
    held = {"now": set(), "max": 0}
    monkeypatch.setattr(torch_race, "candidates", _buffered([DEFAULT, "k0"], 1 << 20, held, calls))
    (res,) = run(TorchBackend(repeats=3, mem_cap_bytes=_fixed() // 2), lease_for(SHAPE))
    assert res.status == "failed" and res.error.startswith("not raced: the shape holds about"), res.error
    assert "free for it under the" in res.error and not calls


def test_a_candidate_too_large_alone_is_a_failed_candidate_not_a_failed_shape(monkeypatch):
    held = {"now": set(), "max": 0}
    big = _buffered(["huge"], 64 << 20, held)
    small = _buffered([DEFAULT, "k0"], 1 << 20, held)
    monkeypatch.setattr(torch_race, "candidates", lambda *a: small(*a) + big(*a))
    cap = _fixed() + RaceMemory.MARGIN + 8 * (1 << 20)
    (res,) = run(TorchBackend(repeats=3, mem_cap_bytes=cap), lease_for(SHAPE))
    by = {c["name"]: c for c in res.candidates}
    assert res.status in ("ok", "default_best") and res.kernel_name != "huge"
    assert by["huge"]["error"].startswith("not raced: it holds about 0.06 GiB")


def test_a_candidate_out_of_memory_while_sampled_is_a_failed_candidate(monkeypatch):
    """Its first call passes; it runs out of memory on a later call: k0 on its screen sample (call 2), k1 in the
    exhaustive race's first capture window (call 8: after its first call, check, two warm-ups, the capture and
    its guarded replay). Each is out with the reason, the race goes on and books a winner among the rest.
    Without the ReplayFailed handling in _sample_held and _time_window the error leaves the race."""
    calls = {}
    held = {"now": set(), "max": 0}
    names = [DEFAULT, "k0", "k1", "k2"]
    monkeypatch.setattr(torch_race, "candidates", _buffered(names, 1 << 20, held, calls, fail_on={"k0": 2}))
    (res,) = run(TorchBackend(repeats=6), lease_for(SHAPE))
    by = {c["name"]: c for c in res.candidates}
    assert res.status in ("ok", "default_best"), res.error
    assert by["k0"]["error"].startswith("out of memory: CUDA out of memory"), by["k0"]
    assert all(by[n]["error"] is None for n in (DEFAULT, "k1", "k2"))
    calls.clear()
    monkeypatch.setattr(torch_race, "candidates", _buffered(names, 1 << 20, held, calls, fail_on={"k1": 8}))
    (res,) = run(TorchBackend(repeats=6, race="exhaustive"), lease_for(SHAPE))
    by = {c["name"]: c for c in res.candidates}
    assert res.status in ("ok", "default_best") and by["k1"]["error"].startswith("out of memory"), by["k1"]
    assert by[DEFAULT]["final"] and res.kernel_name != "k1"


def test_out_of_memory_outside_any_candidate_is_a_failed_shape_with_the_reason(monkeypatch):
    """The inputs or the reference run out of memory: the shape fails with the reason, the next shape of the
    lease is raced. Guards `except torch.OutOfMemoryError` in tune()."""
    backend = TorchBackend(repeats=3, only=[DEFAULT, "torch_mm_bt_contig"])
    real = backend.inputs
    monkeypatch.setattr(backend, "inputs", lambda shape: (_ for _ in ()).throw(oom("9.00 GiB"))
                        if shape["M"] == "16" else real(shape))
    first, second = run(backend, lease_for(SHAPE, (8, 128, 256, False)))
    assert first.status == "failed" and first.error.startswith("out of memory racing the shape (planned")
    assert "Tried to allocate 9.00 GiB" in first.error and "more detail" not in first.error
    assert second.status in ("ok", "default_best"), second.error


def test_a_candidates_graph_bytes_count_its_buffers_and_two_calls():
    """What the plan adds up: the library paths' outputs, a split-K's fp32 temporaries (torch_candidates)."""
    a, b = torch.zeros(16, 256, dtype=torch.bfloat16), torch.zeros(128, 256, dtype=torch.bfloat16)
    by = {c.name: c for c in torch_race.candidates(a, b, None, torch.bfloat16)}
    assert by[DEFAULT].nbytes == graph_bytes(0, 16 * 128 * 4) == 2 * 16 * 128 * 4
    assert by["torch_splitk2_fp32acc"].nbytes > by["torch_mm_bt_contig"].nbytes > by[DEFAULT].nbytes


def test_the_workers_memory_cap_reaches_the_race():
    """TUNER_MEM_CAP_GIB (or --mem-cap-gib): the torch race's room where a server shares the card."""
    from workers.cli import make_backend
    from workers.settings import WorkerSettings
    backend = make_backend(WorkerSettings.load({"backend": "torch"}, {"TUNER_MEM_CAP_GIB": "1.5"}), "cpu")
    assert backend.memory.cap == int(1.5 * GIB)
    assert make_backend(WorkerSettings(backend="torch"), "cpu").memory.cap is None
