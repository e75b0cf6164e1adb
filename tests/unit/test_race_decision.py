"""Issue 34: who takes a shape, decided on per-capture-window timings recorded on the H200 (pure: no device, no
kernel runs). The windows are the window medians (us) the races printed in call C of
benchmarks/early_stop_issue34_h200.txt (the `captures` of each candidate record in that run's JSON), same
machine, same process."""

from __future__ import annotations

import math

import pytest

from app.domain import student_t
from workers.backends import torch_decide
from workers.backends.torch_decide import Race, Schedule, decide
from workers.backends.torch_race import DEFAULT, MM_BT, Candidate, Entry, TorchBackend

# M=256 N=4096 K=4096: the halving race (5 windows, then its contested pair timed again: 10) and the exhaustive
# race (5 windows) both kept F.linear in a tie; the confirmation race's referee put F.linear 4.6% behind
HV_256 = {DEFAULT: [15.51, 16.11, 17.02, 15.29, 15.94, 15.50, 16.46, 15.61, 16.41, 15.75],
          MM_BT: [15.53, 15.50, 16.19, 15.09, 15.01, 16.72, 15.21, 16.03, 15.46, 15.52]}
EX_256 = {DEFAULT: [15.74, 16.15, 15.80, 16.07, 16.45], MM_BT: [15.94, 15.95, 15.44, 15.38, 15.04]}
# the halving race's windows where the matmul won in all five (call C)
WON = {
    (200, 8192, 7392): {DEFAULT: [40.54, 40.43, 40.54, 40.26, 40.58], MM_BT: [38.13, 38.24, 38.34, 38.16, 38.02]},
    (32, 1280, 8192): {DEFAULT: [9.12, 9.12, 9.08, 9.13, 9.11], MM_BT: [8.99, 9.01, 9.01, 9.01, 8.98]},
    (512, 1280, 8192): {DEFAULT: [21.55, 22.99, 21.70, 22.63, 21.58], MM_BT: [21.14, 21.30, 21.28, 21.44, 21.18]},
    (32, 6144, 4096): {DEFAULT: [16.44, 16.30, 16.22, 16.34, 16.23], MM_BT: [16.08, 16.14, 15.95, 15.88, 15.92]},
    (1, 4096, 14336): {DEFAULT: [32.96, 32.86, 33.07, 32.81, 32.96], MM_BT: [32.62, 32.34, 32.38, 32.31, 32.42]},
}


def entry(name: str, medians_us: list[float], first: int = 1, per: int = 6) -> Entry:
    """An entry timed in len(medians_us) capture windows (ids first, first+1, ...), each window's samples at its
    median (+-0.05%)."""
    e = Entry(Candidate(name, "torch", 0, lambda: None))
    add(e, medians_us, first, per)
    e.err = 0.0
    return e


def add(e: Entry, medians_us: list[float], first: int, per: int = 3) -> None:
    for w, us in enumerate(medians_us, first):
        ts = [us * 1e-6 * (1 + 0.0005 * ((i % 3) - 1)) for i in range(per)]
        e.caps.append((w, ts))
        e.final.extend(ts)


def race_of(windows: dict[str, list[float]], kind: str = "halving") -> Race:
    return Race([entry(n, ms) for n, ms in windows.items()], kind)


def test_recorded_capture_noise_hides_the_matmul_from_the_sign_test_not_from_the_t_test():
    """M=256 N=K=4096, all 15 windows the two full races timed the pair in: the matmul was faster in 11 (sign
    test 0.941, under 0.95: F.linear kept a tie) by 2.3% in the median window; the paired t-test on the log
    ratios weighs how much (0.978): the matmul takes the shape. Guards t_confidence in torch_decide.confidence."""
    windows = {n: HV_256[n] + EX_256[n] for n in (DEFAULT, MM_BT)}
    ratios = [m / d for m, d in zip(windows[MM_BT], windows[DEFAULT])]
    assert torch_decide.sign_confidence(sum(r < 1 for r in ratios), 15) == pytest.approx(0.9408, abs=1e-4)
    assert torch_decide.t_confidence([math.log(r) for r in ratios]) == pytest.approx(0.978, abs=1e-3)
    race = decide(race_of(windows), [DEFAULT], Schedule())
    assert race.winner.name == MM_BT and race.decision == "win" and race.confidence >= 0.95, race.reason


def test_a_tie_over_the_floor_is_timed_again_until_the_windows_decide_it(monkeypatch):
    """The exhaustive race's 5 windows (4 faster, 0.928) are a contested tie; each re-time of the pair adds
    windows (here: the halving race's recorded ones, its last five first) and the race is decided again, up to
    Schedule.retimes times: the second re-time settles it for the matmul. One re-time (the rule before) left
    F.linear the shape on 10 windows. Guards the loop in TorchBackend._settled."""
    backend = TorchBackend()
    race = race_of(EX_256)
    race.windows = 5
    by = {e.name: e for e in race.entries}
    more = [(5, 10), (0, 5)]

    def final(race_, pair, n, windows=None, per=None):
        lo, hi = more.pop(0)
        assert sorted(e.name for e in pair) == sorted(by) and windows == backend.schedule.retime_windows
        for e in pair:
            add(e, HV_256[e.name][lo:hi], first=100 + lo)
        race_.windows += hi - lo
    monkeypatch.setattr(backend, "_final", final)
    race = backend._settled(race, [DEFAULT], 30)
    assert race.retimes == 2 and not more and race.winner.name == MM_BT and race.decision == "win", race.reason


@pytest.mark.parametrize("shape", sorted(WON))
def test_recorded_five_of_five_wins_stay_wins(shape):
    race = decide(race_of(WON[shape]), [DEFAULT], Schedule())
    assert race.winner.name == MM_BT and race.decision == "win"


def test_a_noisy_fastest_does_not_hand_the_shape_to_a_default_the_runner_up_beats():
    """A Triton config 1.5% ahead of the matmul in the median window but slower than F.linear in two of five
    (a noisy capture pair) ties with F.linear; the matmul beat F.linear in all five recorded windows (M=32
    N=6144 K=4096). The rule used to weigh only the fastest against the default, and a tie with it gave the
    shape to F.linear: now the next challenger that beats the holder takes it. Guards the challenger loop in
    torch_decide.decide."""
    windows = dict(WON[(32, 6144, 4096)])
    windows["triton_noisy"] = [15.55, 15.60, 16.90, 15.50, 16.95]
    race = decide(race_of(windows), [DEFAULT], Schedule())
    assert race.fastest.name == "triton_noisy" and race.winner.name == MM_BT and race.decision == "win"


def test_a_confirmation_gives_the_shape_to_a_finalist_that_beats_the_incumbent_not_to_a_noisy_default():
    """A confirmation (the incumbent holds it): F.linear ran fast in three captures (the fastest by pooled
    median) but is no faster than the incumbent across the windows; a finalist 2% faster than the incumbent in
    every window. Weighing only the fastest, the incumbent kept a tie; now the finalist takes it."""
    inc = WON[(200, 8192, 7392)][MM_BT]
    windows = {MM_BT: inc, DEFAULT: [37.0, 37.2, 40.54, 37.1, 40.58], "finalist": [x * 0.98 for x in inc]}
    race = decide(race_of(windows, "confirm"), [MM_BT, DEFAULT], Schedule())
    assert race.fastest.name == DEFAULT and race.winner.name == "finalist" and race.decision == "win"


def test_a_large_gain_in_three_of_five_windows_is_no_win():
    """Capture noise can put one path 7% ahead in three windows and 8% behind in two: the old escape (a median
    gain over the 5% cap in most windows) handed such a shape over, which is how a confirmation race can give
    the shape to a candidate both full races timed slower. Now it is a tie the holder keeps, contested (timed
    again). Guards the removed `gain > tie_cap and wins > n / 2` in torch_decide.judge."""
    race = decide(race_of({MM_BT: [100] * 5, DEFAULT: [93, 93, 93, 108, 108]}, "confirm"), [MM_BT, DEFAULT],
                  Schedule())
    assert race.winner.name == MM_BT and race.decision == "tie" and race.contested is not None


def test_the_t_test_matches_students_table():
    assert student_t.t_sf(2.132, 4) == pytest.approx(0.05, abs=2e-4)
    assert student_t.t_sf(1.833, 9) == pytest.approx(0.05, abs=2e-4)
    assert student_t.t_sf(-6.314, 1) == pytest.approx(0.95, abs=2e-4)
    assert torch_decide.t_confidence([-0.01] * 5) == 1.0 and torch_decide.t_confidence([0.01, -0.01]) == 0.0
