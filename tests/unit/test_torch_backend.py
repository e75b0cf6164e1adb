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
    """Without the default in the race there is no baseline: the winner's row goes in (AITER's no_baseline)."""
    only = ["torch_splitk4_fp32acc", "torch_splitk2_fp32acc", "torch_mm_bt_contig"]
    (res,) = run(TorchBackend(repeats=5, only=only), lease_for((16, 256, 512, True)))
    assert res.status == "ok", res.error
    assert {c["name"] for c in res.candidates} == set(only) and res.kernel_name in only
    assert res.err_ratio <= 0.05 and res.default_us is None
    assert list(res.row) == HEADER
    assert res.row["kernelName"] == res.kernel_name and float(res.row["us"]) > 0 and res.row["bias"] == "True"


def _rigged(monkeypatch, extra):
    real = torch_race.candidates
    monkeypatch.setattr(torch_race, "candidates", lambda a, b, bias, d: real(a, b, bias, d) + extra(a, b, bias, d))


def test_halving_screens_everyone_and_times_only_finalists_fully(monkeypatch):
    """Slow candidates are dropped after their screening sample; a wrong but fast one reaches the final round,
    where the error check throws it out; the default is always timed fully. Five slow ones (50 ms, 10^4 times
    the real kernels) carry the saving: even if noise keeps all four real kernels to the final (it did on a
    loaded machine), 12 + 15 + 30 samples stay under the exhaustive race's 60; without the screen, 102."""
    slow_names = [f"slow{i}" for i in range(5)]

    def extra(a, b, bias, d):
        ref = torch.nn.functional.linear(a, b, bias).to(d)
        zeros = torch.zeros_like(ref)

        def slow():
            time.sleep(0.05)
            return ref
        return [*(torch_race.Candidate(n, "torch", 0, slow) for n in slow_names),
                torch_race.Candidate("wrong_but_fast", "torch", 0, lambda: zeros)]
    _rigged(monkeypatch, extra)
    (res,) = run(TorchBackend(repeats=6), lease_for((8, 128, 256, False)))
    by = {c["name"]: c for c in res.candidates}
    assert res.race["kind"] == "halving" and len(res.candidates) == 10
    for n in slow_names:
        assert by[n]["samples"] == 1 and by[n]["rounds"] == 0 and by[n]["err_ratio"] is None
    # checked before the final round (issue 34): a wrong finalist is never timed in it
    assert by["wrong_but_fast"]["err_ratio"] > 0.05 and not by["wrong_but_fast"]["final"]
    assert by["torch_linear"]["samples"] >= 6 + 3 and by["torch_linear"]["err_ratio"] == 0.0
    assert res.kernel_name != "wrong_but_fast" and res.status in ("ok", "default_best")
    assert res.race["samples"] < 6 * len(res.candidates)


def test_a_tie_goes_to_the_default_and_no_row_is_emitted(monkeypatch):
    """A candidate faster than the default, but inside the tie band, loses to it: the shape is recorded as
    'default is best', with no row. (The band is widened here so a CPU's timing decides nothing.)"""
    def two(a, b, bias, d):
        out = torch.nn.functional.linear(a, b, bias).to(d)  # once: no torch op is timed (load stretches those)

        def default():
            time.sleep(0.02)
            return out
        return [torch_race.Candidate("torch_linear", "torch", 0, default),
                torch_race.Candidate("faster", "torch", 0, lambda: out)]
    monkeypatch.setattr(torch_race, "candidates", two)
    backend = TorchBackend(schedule=torch_race.Schedule(final=5, tie_floor=1.0))  # any faster time is a tie
    (res,) = run(backend, lease_for((8, 64, 128, False)))
    assert res.race["fastest"] == "faster"
    assert res.kernel_name == "torch_linear" and res.status == "default_best" and res.row is None
    assert res.us == res.default_us
    (res,) = run(TorchBackend(schedule=torch_race.Schedule(final=5, tie_floor=0.0, z=0.0)),
                 lease_for((8, 64, 128, False)))
    assert res.kernel_name == "faster" and res.status == "ok" and res.row["kernelName"] == "faster"


def test_the_default_and_the_incumbent_survive_every_round_even_when_slowest(monkeypatch):
    """The screen may drop anything but the default and the incumbent: they reach the final round (and the
    tie rule) however slow they look. Guards `or e.name in protected` in TorchBackend._survivors."""
    def rigged(a, b, bias, d):
        # the right output computed once, so no torch op is timed: beside busy loops a tiny F.linear took 6-12 ms
        # (torch's threads wait for a descheduled one), the leader with it, leaving 20 ms sleeps only ~4x slower
        out = torch.nn.functional.linear(a, b, bias).to(d)

        def slow(name, s):
            def run():
                time.sleep(s)
                return out
            return torch_race.Candidate(name, "torch", 0, run)
        fast = [torch_race.Candidate(f"fast{i}", "torch", 0, lambda: out) for i in range(8)]
        return [slow("torch_linear", 0.02), slow("old_winner", 0.03), slow("slow_other", 0.02), *fast]
    monkeypatch.setattr(torch_race, "candidates", rigged)
    lease = lease_for((8, 64, 128, False))
    lease["shapes"][0]["incumbent"] = "old_winner"
    (res,) = run(TorchBackend(repeats=4), lease)
    by = {c["name"]: c for c in res.candidates}
    rounds = len(torch_race.Schedule().rounds)
    assert by["torch_linear"]["rounds"] == by["old_winner"]["rounds"] == rounds
    # the screen did drop the unprotected one that is just as slow (~10^4 x the leader: outside any noise band,
    # where eight equally fast candidates may all stay inside a noisy machine's band)
    assert by["slow_other"]["rounds"] < rounds
    assert res.race["finalists"] < len(res.candidates)
    assert res.default_us is not None and by["torch_linear"]["us"] == res.default_us


def _entry(name, us, n=30, jitter=0.001):
    e = torch_race.Entry(torch_race.Candidate(name, "torch", 0, lambda: None))
    e.final = [us * 1e-6 * (1 + jitter * ((i % 5) - 2)) for i in range(n)]
    e.err = 0.0
    return e


def test_with_the_shipped_schedule_a_gain_inside_noise_goes_to_the_default():
    """The rule as shipped (no widened band): 0.6% faster than the default is a tie the default keeps, 3% is
    a win; with an incumbent, the default still comes first. Guards the tie loop in TorchBackend._decide."""
    backend = TorchBackend()
    race = backend._decide(torch_race.Race([_entry("torch_linear", 100.0), _entry("x", 99.4)], "halving"),
                           ["torch_linear"])
    assert race.fastest.name == "x" and race.winner.name == "torch_linear"
    race = backend._decide(torch_race.Race([_entry("torch_linear", 100.0), _entry("x", 97.0)], "halving"),
                           ["torch_linear"])
    assert race.winner.name == "x"
    race = backend._decide(torch_race.Race([_entry("torch_linear", 100.0), _entry("inc", 99.6), _entry("x", 99.3)],
                                           "halving"), ["torch_linear", "inc"])
    assert race.winner.name == "torch_linear"


def test_every_pass_samples_every_replay_once_in_a_fresh_order():
    """Interleaved samples in a shuffled order, so no candidate always follows the same neighbour."""
    seen: list[int] = []
    replays = [((lambda i=i: seen.append(i)), 1) for i in range(6)]
    got = torch_race.Timer(torch.device("cpu"), seed=1).sample(replays, 8)
    assert [len(ts) for ts in got] == [8] * 6
    passes = [tuple(seen[i:i + 6]) for i in range(0, len(seen), 6)]
    assert all(sorted(p) == list(range(6)) for p in passes)
    assert len(set(passes)) > 1


def test_the_compile_lane_calls_every_candidate_once_per_dtype_and_bias(monkeypatch):
    calls: list[tuple[str, bool]] = []

    def rigged(a, b, bias, d):
        return [torch_race.Candidate(n, "torch", 0, lambda n=n: calls.append((n, bias is not None)))
                for n in ("torch_linear", "other")]
    monkeypatch.setattr(torch_race, "candidates", rigged)
    backend = TorchBackend()
    assert not backend.builds  # nothing to build on a CPU: the agent runs no lane
    from types import SimpleNamespace

    from workers.agent import Agent
    agent = SimpleNamespace(cfg=SimpleNamespace(compile_budget_s=1800.0), backend=backend, warmed=set())
    lease = SimpleNamespace(family="bf16_gemm")
    assert not Agent.needs_build(agent, lease)  # type: ignore[arg-type]
    monkeypatch.setattr(TorchBackend, "builds", True)
    assert Agent.needs_build(agent, lease)  # type: ignore[arg-type]
    report = backend.warm(lease_for((8, 64, 128, False), (16, 64, 128, True)), 60.0)
    assert report["ok"] and sorted(calls) == sorted([("torch_linear", False), ("other", False),
                                                     ("torch_linear", True), ("other", True)])


def test_a_row_only_where_it_beats_the_default_by_the_margin():
    from workers.backends.base import row_helps
    assert row_helps(96.9, 100.0) and not row_helps(97.1, 100.0)  # AITER's 3% default
    assert not row_helps(99.0, 100.0, 1.5) and row_helps(98.0, 100.0, 1.5)
    assert row_helps(50.0, None) and not row_helps(None, 100.0)


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
    (res,) = run(TorchBackend(repeats=3, candidate_limit_s=0.2, race="exhaustive"), lease_for((8, 128, 256, False)))
    by = {c["name"]: c for c in res.candidates}
    assert res.status in ("ok", "default_best") and res.kernel_name not in ("wrong_but_fast", "raises", "too_slow")
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
    assert res.status in ("ok", "default_best") and len(res.candidates) < len(full.candidates)


# -- issue 28: robust noise, a bounded screen, contested ties re-sampled --------------------------------------

def _noisy(name, us, n=30, outliers=0, jitter=0.001, scale=3.0):
    """n samples around `us` with a small jitter, the first `outliers` of them `scale` times slower."""
    e = _entry(name, us, n, jitter)
    e.final[:outliers] = [us * 1e-6 * scale] * outliers
    return e


def test_a_few_outlier_samples_cannot_hand_a_ten_percent_win_to_the_default():
    """Issue 28's miss: a Triton config 10.8% faster went to F.linear because a stdev-based sigma (~0.1 per
    sample) widened the tie band. The spread is robust (MAD): 4 stray samples of 30 barely move it. Guards
    rel_spread in pooled_sigma."""
    backend = TorchBackend()
    entries = [_noisy("torch_linear", 100.0, outliers=4), _noisy("x", 90.0, outliers=4), _noisy("y", 95.0, outliers=4)]
    assert torch_race.pooled_sigma(entries, 0.01) < 0.01
    race = backend._decide(torch_race.Race(entries, "halving"), ["torch_linear"])
    assert race.winner.name == "x" and race.contested is None


def test_however_noisy_the_samples_a_gain_over_the_cap_is_never_a_tie():
    """Genuine noise (~7% per-sample spread) makes the statistical band ~7% at 30 samples; a 6% gain is still
    no tie (Schedule.tie_cap, 5%), and a 2% one is. Guards min(tie_cap, ...) in TorchBackend._decide."""
    backend = TorchBackend()
    race = backend._decide(torch_race.Race([_entry("torch_linear", 100.0, jitter=0.05), _entry("x", 94.0, jitter=0.05)],
                                           "halving"), ["torch_linear"])
    assert backend.schedule.band(race.sigma, 30, 30, 0.01) > 0.06 and race.winner.name == "x"
    race = backend._decide(torch_race.Race([_entry("torch_linear", 100.0, jitter=0.05), _entry("x", 98.0, jitter=0.05)],
                                           "halving"), ["torch_linear"])
    assert race.winner.name == "torch_linear"


def test_a_tie_kept_on_the_noise_band_alone_is_timed_again_before_it_is_decided(monkeypatch):
    """A 2% gain inside a noisy band (over the 1% floor) marks the race contested; the two entries get more
    samples (here: quiet ones) and the race is decided again. Guards TorchBackend._settled."""
    backend = TorchBackend()
    default, fast = _entry("torch_linear", 100.0, n=10, jitter=0.03), _entry("x", 98.0, n=10, jitter=0.03)
    for e in (default, fast):
        e.replay = (lambda: None, 1)
    sampled = []

    def quiet(entries, n, final=False):
        sampled.append(sorted(e.name for e in entries))
        for e in entries:
            e.final = [e.median * (1 + 0.0005 * ((i % 3) - 1)) for i in range(3 * n)]
    monkeypatch.setattr(backend, "_sample", quiet)
    race = backend._settled(torch_race.Race([default, fast], "halving"), ["torch_linear"], 30)
    assert sampled == [["torch_linear", "x"]] and race.resampled
    assert race.winner.name == "x" and race.contested is None


def test_the_screen_keeps_a_bounded_number_of_survivors():
    """Thirty candidates inside one noise band: the round keeps `cap` of them (the fastest) and the protected
    ones, never all thirty (issue 28: the band kept 25-29 of 59). Guards `kept < cap` in _survivors."""
    backend = TorchBackend()
    live = [_entry(f"c{i:02d}", 100.0 + 0.01 * i, n=3) for i in range(30)] + [_entry("torch_linear", 101.0, n=3)]
    out = backend._survivors(live, 0.15, 3, ["torch_linear"])
    assert [e.name for e in out] == ["c00", "c01", "c02", "torch_linear"]


def test_graphs_are_captured_only_for_the_screens_survivors(monkeypatch):
    """The screen times eager calls; a graph is captured (Timer.replayable) only for a candidate that goes on.
    Guards graph=not sch.eager_screen in TorchBackend.halving."""
    def many(a, b, bias, d):
        out = torch.nn.functional.linear(a, b, bias).to(d)

        def slow():
            time.sleep(0.02)
            return out
        return [torch_race.Candidate("torch_linear", "torch", 0, lambda: out),
                *(torch_race.Candidate(f"slow{i}", "torch", 0, slow) for i in range(12))]
    monkeypatch.setattr(torch_race, "candidates", many)
    backend = TorchBackend(repeats=3)
    captured = []
    real = backend.timer.replayable
    monkeypatch.setattr(backend.timer, "replayable", lambda fn: (captured.append(fn), real(fn))[1])
    (res,) = run(backend, lease_for((8, 64, 128, False)))
    cap = torch_race.Schedule().rounds[0][2]
    assert len(res.candidates) == 13 and 1 <= len(captured) <= cap + 1
    assert res.kernel_name == "torch_linear"


# -- issue 24: a confirmation race for a shape carried over an image upgrade ----------------------------------

def _five(a, b, bias, d):
    """Five candidates with the right output computed once; 'slow' sleeps, so timing decides nothing else."""
    out = torch.nn.functional.linear(a, b, bias).to(d)

    def slow():
        time.sleep(0.02)
        return out
    names = ["torch_linear", "old_winner", "runner_up", "third", "never_raced"]
    return [torch_race.Candidate(n, "torch", 0, slow if n == "torch_linear" else (lambda: out)) for n in names]


def test_a_carried_shape_races_only_the_default_the_incumbent_and_known_finalists(monkeypatch):
    """Guards TorchBackend._confirmation: the result lists exactly what was raced; a finalist this image lacks
    is skipped and named."""
    monkeypatch.setattr(torch_race, "candidates", _five)
    lease = lease_for((8, 64, 128, False))
    lease["shapes"][0].update(incumbent="old_winner", finalists=["old_winner", "runner_up", "gone_kernel"])
    (res,) = run(TorchBackend(repeats=4), lease)
    assert res.race["kind"] == "confirm" and res.race["skipped"] == ["gone_kernel"]
    assert sorted(c["name"] for c in res.candidates) == ["old_winner", "runner_up", "torch_linear"]
    by = {c["name"]: c["samples"] for c in res.candidates}  # a contested tie may time its pair again
    sch = torch_race.Schedule()
    assert by["torch_linear"] == sch.captures * sch.per_window(sch.confirm) <= min(by.values())
    assert res.kernel_name in ("old_winner", "runner_up") and res.status == "ok"


def test_an_incumbent_the_image_no_longer_has_means_a_full_race(monkeypatch):
    monkeypatch.setattr(torch_race, "candidates", _five)
    lease = lease_for((8, 64, 128, False))
    lease["shapes"][0].update(incumbent="renamed_away", finalists=["runner_up"])
    (res,) = run(TorchBackend(repeats=4), lease)
    assert res.race["kind"] == "halving" and "renamed_away" in res.race["full_race_why"]
    assert len(res.candidates) == 5


def test_the_confirmation_tie_goes_to_the_incumbent_and_the_default_keeps_a_race_it_leads():
    """A finalist 0.6% faster than the incumbent is a tie the incumbent keeps; where the default is itself the
    fastest, an incumbent inside its noise does not take the race (the loop's `break`)."""
    backend = TorchBackend()
    race = backend._decide(torch_race.Race([_entry("torch_linear", 110.0), _entry("inc", 100.0), _entry("x", 99.4)],
                                           "confirm"), ["torch_linear", "inc"])
    assert race.fastest.name == "x" and race.winner.name == "inc"
    race = backend._decide(torch_race.Race([_entry("torch_linear", 99.6), _entry("inc", 100.0)], "confirm"),
                           ["torch_linear", "inc"])
    assert race.winner.name == "torch_linear"
