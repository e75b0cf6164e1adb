"""The serving A/B's statistics on synthetic, seeded data: verdicts, intervals, MDE, the identical-arm control,
drift cancelling in mirrored rounds, a position in the round falling on no arm, and the void reasons."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from app.ab_wire import RequestRecord
from app.domain import ab_stats as S

TOKENS = 32


def records(arm, band, rep, tok_s, n=8, t0=0.0, err=0):
    """n requests of TOKENS tokens each whose window gives tok_s output tokens per second."""
    window = n * TOKENS / tok_s
    out = [RequestRecord(arm=arm, band=band, repeat=rep, started_s=t0, ttft_s=0.01 * 1000 / tok_s,
                         itl_s=[window / TOKENS] * (TOKENS - 1), latency_s=window, input_tokens=16,
                         output_tokens=TOKENS) for _ in range(n)]
    out += [RequestRecord(arm=arm, band=band, repeat=rep, started_s=t0, error="ConnectError") for _ in range(err)]
    return out


def band_passes(rng, band, rounds, effect_b=0.0, effect_ap=0.0, noise=0.01, drift=0.0, base=1000.0, position=None,
                **kw):
    """Rounds in the driver's order (round_order); each pass's throughput is base x (1 + effect) x (1 + drift x t)
    x position[its place in the round] x noise."""
    passes, t = {}, 0
    for r in range(rounds):
        for place, arm in enumerate(S.round_order(r)):
            eff = {"A": 0.0, "A_prime": effect_ap, "B": effect_b}[arm]
            tok = base * (1 + eff) * (1 + drift * t) * (position or {}).get(place, 1.0) * math.exp(rng.gauss(0, noise))
            passes[(r, arm)] = records(arm, band, r, tok, t0=float(t), **kw)
            t += 1
    return passes


def test_t_quantiles_match_the_tables():
    assert S.t_ppf(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert S.t_ppf(0.975, 5) == pytest.approx(2.5706, abs=1e-4)
    assert S.t_ppf(0.8, 5) == pytest.approx(0.9195, abs=1e-4)
    assert S.t_ppf(0.995, 3) == pytest.approx(5.8409, abs=1e-4)
    assert S.t_ppf(0.025, 10) == pytest.approx(-2.2281, abs=1e-4)


def test_pass_stats_throughput_and_percentiles():
    st = S.pass_stats(records("A", "b", 0, 500.0, n=4, err=1))
    assert st.requests == 5 and st.completed == 4 and st.errors == 1 and st.first_error == "ConnectError"
    assert st.metrics["output_tok_s"] == pytest.approx(500.0)
    assert S.percentile([1, 2, 3, 4], 0.5) == 2.5


@pytest.mark.parametrize("effect,verdict", [(0.08, "gain"), (-0.03, "regression"), (0.0, "neutral")])
def test_planted_effects_are_found_with_an_interval_that_covers_them(effect, verdict):
    rng = random.Random(1)
    res = S.analyse_band("b", band_passes(rng, "b", 6, effect_b=effect, noise=0.005), 6, 3, S.GateParams())
    assert res.verdict == verdict
    e = res.effect[S.PRIMARY]
    assert e["lo"] <= effect <= e["hi"] and 0 < e["mde"] < 0.03
    assert not res.control_flags


def test_a_linear_drift_cancels_in_mirrored_rounds():
    """A 1% per pass drift (18% over the band) and no effect: without the mirrored pairs B/A would read +1%."""
    rng = random.Random(2)
    res = S.analyse_band("b", band_passes(rng, "b", 6, drift=0.01, noise=0.002), 6, 1, S.GateParams())
    assert res.verdict == "neutral" and abs(res.effect[S.PRIMARY]["effect"]) < 0.004


def test_the_round_orders_are_a_williams_design_in_mirrored_pairs():
    """Over one cycle every arm takes every place twice and follows every other arm twice; each round and the next
    are mirrored (a linear drift cancels over the pair); the run's first round is still A B A'."""
    cycle = [S.round_order(r) for r in range(6)]
    assert len(set(cycle)) == 6 and cycle[0] == ("A", "B", "A_prime") and S.round_order(6) == cycle[0]
    for arm in ("A", "B", "A_prime"):
        assert sorted(order.index(arm) for order in cycle) == [0, 0, 1, 1, 2, 2], arm
    follows = Counter((o[i], o[i + 1]) for o in cycle for i in range(2))
    assert len(follows) == 6 and set(follows.values()) == {2}, follows
    assert all(cycle[k + 1] == cycle[k][::-1] for k in range(0, 6, 2))


def test_a_slow_place_in_the_round_falls_on_no_arm():
    """The pass measured second in a round runs 3% slow (the node just after another server's load) and nothing is
    planted: over the six orders B reads 0 and the control stays quiet. With B second in every round (the former
    A B A' / A' B A) B read the place's -3% as a regression, and the control, never second, could not show it."""
    rng = random.Random(4)
    res = S.analyse_band("b", band_passes(rng, "b", 6, noise=0.002, position={1: 0.97}), 6, 1, S.GateParams())
    assert res.verdict == "neutral" and abs(res.effect[S.PRIMARY]["effect"]) < 0.004, res.effect[S.PRIMARY]
    assert not res.control_flags


def test_servers_start_with_a_between_b_and_the_control_which_goes_first_by_draw():
    """A between the others: B's and A''s start offsets from A are equal and opposite, so the control shows what
    start order does to B; which of them goes first is drawn per run."""
    assert {o[1] for o in S.START_ORDERS} == {"A"} and {o[0] for o in S.START_ORDERS} == {"B", "A_prime"}
    rng = random.Random(5)
    assert {S.draw_start_order(rng) for _ in range(20)} == set(S.START_ORDERS)


def test_the_control_flags_an_effect_between_identical_arms_and_voids_the_run():
    rng = random.Random(3)
    bands = [S.analyse_band("b", band_passes(rng, "b", 6, effect_b=0.08, effect_ap=0.05, noise=0.005), 6, 1,
                            S.GateParams())]
    assert bands[0].control_flags
    run = S.run_verdict(bands)
    assert run.verdict == "void" and "identical-arm control" in run.reason and run.control_flagged == ["b"]
    assert S.promotable(run.as_dict()).startswith("the run is void")


def test_null_runs_are_flagged_at_most_at_the_runs_confidence():
    """200 seeded runs of 3 bands, no effect anywhere: the control flags, and a band's false verdict, at most
    about alpha = 5% of runs (Bonferroni over bands)."""
    rng = random.Random(4)
    flagged = false_verdict = 0
    for _ in range(200):
        bands = [S.analyse_band(f"b{i}", band_passes(rng, f"b{i}", 6, noise=0.02), 6, 3, S.GateParams())
                 for i in range(3)]
        flagged += any(b.control_flags for b in bands)
        false_verdict += any(b.verdict != "neutral" for b in bands)
    assert flagged <= 0.075 * 200 and false_verdict <= 0.075 * 200


def test_too_few_requests_and_too_many_errors_void_the_band_naming_why():
    rng = random.Random(5)
    passes = band_passes(rng, "b", 4)
    passes[(2, "B")] = records("B", "b", 2, 1000.0, n=2)
    res = S.analyse_band("b", passes, 4, 1, S.GateParams(min_requests=4))
    assert res.verdict == "void" and "too few requests: arm B pass 2 completed 2 of 2" in res.reason
    passes = band_passes(rng, "b", 4)
    passes[(1, "A")] = records("A", "b", 1, 1000.0, n=8, err=3)
    res = S.analyse_band("b", passes, 4, 1, S.GateParams())
    assert res.verdict == "void" and "3 of 11 requests failed" in res.reason
    passes = band_passes(rng, "b", 4)
    del passes[(3, "A_prime")]
    assert "pass 3 of arm A_prime was not measured" in S.analyse_band("b", passes, 4, 1, S.GateParams()).reason


def test_run_verdicts_and_the_promotion_rule():
    rng = random.Random(6)
    gain = S.analyse_band("hi", band_passes(rng, "hi", 6, effect_b=0.08, noise=0.005), 6, 3, S.GateParams())
    neutral = S.analyse_band("mid", band_passes(rng, "mid", 6, noise=0.005), 6, 3, S.GateParams())
    loss = S.analyse_band("lo", band_passes(rng, "lo", 6, effect_b=-0.03, noise=0.005), 6, 3, S.GateParams())
    run = S.run_verdict([loss, neutral, gain])
    assert run.verdict == "regression" and "lo regresses" in S.promotable(run.as_dict())
    ok = S.run_verdict([neutral, gain])
    assert ok.verdict == "gain" and S.promotable(ok.as_dict()) is None
    noisy = S.analyse_band("n", band_passes(rng, "n", 6, noise=0.08), 6, 3, S.GateParams())
    assert noisy.verdict == "neutral" and noisy.effect[S.PRIMARY]["lo"] < -0.05
    why = S.promotable(S.run_verdict([noisy, gain]).as_dict())
    assert "n cannot rule out a loss above 5%" in why  # too noisy to vouch for it
    assert S.promotable(S.run_verdict([noisy, gain]).as_dict(), max_loss=0.9) is None
    void = S.analyse_band("v", {}, 6, 3, S.GateParams())
    assert "v is void" in S.promotable(S.run_verdict([gain, void]).as_dict())
    assert S.run_verdict([gain], ["B did not engage: rank 1"]).verdict == "void"


def decode_records(arm, rep, tpot_s, ttft_s, n=16, tokens=TOKENS, rng=None, noise=0.0, pass_factor=1.0):
    """n requests of `tokens` tokens: TTFT, then tokens - 1 gaps of tpot_s (x per-request noise x the pass's
    shared factor)."""
    out = []
    for i in range(n):
        tp = tpot_s * pass_factor * (math.exp(rng.gauss(0, noise)) if rng else 1.0)
        out.append(RequestRecord(arm=arm, band="b", repeat=rep, started_s=0.001 * i, ttft_s=ttft_s,
                                 itl_s=[tp] * (tokens - 1), latency_s=ttft_s + tp * (tokens - 1), input_tokens=16,
                                 output_tokens=tokens))
    return out


def test_the_decode_rate_reads_a_decode_effect_whole_where_the_pass_throughput_dilutes_it():
    """B decodes 8% faster, its TTFT (connection, prefill: no plant) the same: 1/TPOT reads +8.0%; the pass's
    tokens over its span, which holds the TTFT, reads less."""
    a = S.pass_stats(decode_records("A", 0, 0.040, 0.3))
    b = S.pass_stats(decode_records("B", 0, 0.040 / 1.08, 0.3))
    assert b.metrics["decode_tok_s"] / a.metrics["decode_tok_s"] == pytest.approx(1.08)
    assert 1.0 < b.metrics["output_tok_s"] / a.metrics["output_tok_s"] < 1.07


def test_block_intervals_is_the_two_way_anova_of_rounds_by_arms():
    rows = [[0.0, 0.10, 0.01], [0.02, 0.11, 0.00], [0.01, 0.13, 0.03], [0.00, 0.09, -0.01]]
    ib, ic = S.block_intervals(rows, 0.05, 0.8)
    # residual SS by hand: row means, column means, grand mean; df (4-1)(3-1) = 6
    rm = [sum(r) / 3 for r in rows]
    cm = [sum(r[j] for r in rows) / 4 for j in range(3)]
    g = sum(rm) / 4
    ss = sum((rows[i][j] - rm[i] - cm[j] + g) ** 2 for i in range(4) for j in range(3))
    se = math.sqrt(2 * ss / 6 / 4)
    assert ib.effect == pytest.approx(math.expm1(cm[1] - cm[0])) and ic.effect == pytest.approx(math.expm1(cm[2] - cm[0]))
    assert ib.hi == pytest.approx(math.expm1(cm[1] - cm[0] + S.t_ppf(0.975, 6) * se))
    assert ib.mde == pytest.approx(math.expm1((S.t_ppf(0.975, 6) + S.t_ppf(0.8, 6)) * se))


def test_requests_sharing_a_pass_are_not_counted_as_independent():
    """Null runs whose passes each carry a shared factor (a node's moment: 2% sd) over 16 requests of 3% sd each:
    the unit of replication is the pass, so the control and the verdicts flag at most about alpha = 5% of runs.
    An interval from the requests' own spread (pseudo-replication) would flag most of them."""
    rng = random.Random(9)
    flagged = false_verdict = 0
    for _ in range(200):
        bands = []
        for i in range(3):
            passes = {(r, arm): decode_records(arm, r, 0.04, 0.01, rng=rng, noise=0.03,
                                               pass_factor=math.exp(rng.gauss(0, 0.02)))
                      for r in range(6) for arm in S.round_order(r)}
            bands.append(S.analyse_band(f"b{i}", passes, 6, 3, S.GateParams()))
        flagged += any(b.control_flags for b in bands)
        false_verdict += any(b.verdict != "neutral" for b in bands)
    assert flagged <= 0.075 * 200 and false_verdict <= 0.075 * 200


def ramp_pass(arm, speedup, conc=4, tokens=20, base=0.05, stagger=0.1):
    """One wave of `conc` requests started `stagger` s apart on a server whose step is `speedup` x faster only while
    all `conc` decode (a plant at the band's batch size): each request's token times, as the load generator records
    them."""
    import heapq
    heap = [(i * stagger, i, 0) for i in range(conc)]  # (time of token k, request, k)
    stamps: dict[int, list[float]] = {i: [] for i in range(conc)}
    while heap:
        t, i, k = heapq.heappop(heap)
        stamps[i].append(t)
        running = sum(1 for j in range(conc) if j * stagger <= t and len(stamps[j]) < tokens)
        if k + 1 < tokens:
            heapq.heappush(heap, (t + base / (speedup if running + (k + 1 == tokens) >= conc else 1.0), i, k + 1))
    return [RequestRecord(arm=arm, band="b", repeat=0, started_s=i * stagger, ttft_s=0.0,
                          itl_s=[b - a for a, b in zip(s, s[1:])], latency_s=s[-1] - i * stagger, input_tokens=16,
                          output_tokens=tokens) for i, s in stamps.items()]


def test_the_decode_rate_is_read_while_the_band_s_concurrency_decodes():
    """+8% only while all 4 requests decode: over whole requests the ramp and drain (fewer running) dilute it;
    counted in the steady window, where the band's concurrency decodes, it reads +8%."""
    a, b = ramp_pass("A", 1.0), ramp_pass("B", 1.08)
    whole = S.pass_stats(b).metrics["decode_tok_s"] / S.pass_stats(a).metrics["decode_tok_s"]
    steady = S.pass_stats(b, 4).metrics["decode_tok_s"] / S.pass_stats(a, 4).metrics["decode_tok_s"]
    assert steady == pytest.approx(1.08, abs=0.004) and whole < 1.06


def test_looks_count_the_first_and_every_extension():
    assert S.looks(8, None) == 1 and S.looks(8, 8) == 1
    assert S.looks(6, 18) == 3 and S.looks(6, 16) == 3 and S.looks(4, 6) == 2  # a last, shorter extension counts


def test_a_band_is_undecided_while_its_interval_holds_zero_and_is_too_wide():
    rng = random.Random(11)
    wide = S.analyse_band("b", band_passes(rng, "b", 4, noise=0.03), 4, 1, S.GateParams())
    assert wide.verdict == "neutral" and wide.effect[S.PRIMARY]["mde"] > 0.03
    assert S.undecided(wide, target_mde=0.03, max_loss=0.5)  # the MDE: it could miss a 3% effect
    assert not S.undecided(wide, target_mde=1.0, max_loss=0.5)
    assert S.undecided(wide, target_mde=1.0, max_loss=wide.effect[S.PRIMARY]["lo"] * -0.5)  # cannot vouch
    gain = S.analyse_band("b", band_passes(rng, "b", 4, effect_b=0.3, noise=0.005), 4, 1, S.GateParams())
    assert gain.verdict == "gain" and not S.undecided(gain, target_mde=1e-6, max_loss=1e-6)
    void = S.analyse_band("b", {}, 4, 1, S.GateParams())
    assert void.verdict == "void" and not S.undecided(void, target_mde=1e-6, max_loss=1e-6)


def sequential_band(rng, repeats, max_repeats, target, p, **kw):
    """The service's stopping rule on one band (app/services/ab.py finish): the band's verdict where it stops."""
    rounds = repeats
    passes = band_passes(rng, "b", max_repeats, **kw)
    while True:
        res = S.analyse_band("b", {k: v for k, v in passes.items() if k[0] < rounds}, rounds, 1, p)
        if rounds >= max_repeats or not S.undecided(res, target, 1.0):
            return res
        rounds = min(max_repeats, rounds + S.EXTEND_ROUNDS)


def test_sequential_looks_keep_null_false_verdicts_at_the_runs_confidence():
    """Looking again after each extension is a new chance of a false verdict: 400 null bands looked at up to 3
    times (4, 10, 16 rounds) at confidence 0.9 give a false gain or regression, or a control alarm, in at most
    about alpha = 10% of runs, because each look's interval is at alpha / looks (taking the `/ looks` out of
    analyse_band reads about twice that)."""
    rng = random.Random(12)
    p = S.GateParams(confidence=0.9, looks=S.looks(4, 16))
    false = flagged = 0
    for _ in range(400):
        res = sequential_band(rng, 4, 16, 1e-6, p, noise=0.02)
        false += res.verdict != "neutral"
        flagged += res.control_flags
    assert false <= 0.12 * 400 and flagged <= 0.12 * 400


def test_an_undecided_band_measured_on_finds_a_small_effect_the_first_look_misses():
    """A 3% loss at 2% pass noise: 4 rounds rarely tell it from noise; measured on to 16 rounds while undecided
    (target MDE 2%), the band finds it, in more runs than 4 rounds alone would."""
    rng = random.Random(13)
    p1, p4 = S.GateParams(), S.GateParams(looks=S.looks(4, 16))
    first = seq = 0
    for _ in range(60):
        first += S.analyse_band("b", band_passes(rng, "b", 4, effect_b=-0.03, noise=0.02), 4, 1, p1).verdict \
            == "regression"
        res = sequential_band(rng, 4, 16, 0.02, p4, effect_b=-0.03, noise=0.02)
        seq += res.verdict == "regression"
    assert seq >= 0.8 * 60 and seq > first + 15


def test_a_significant_effect_below_the_smallest_of_interest_is_neutral_within_margin():
    """-0.7% measured tightly is significant; under a 1% smallest effect of interest it reads neutral, naming the
    margin, while -3% still regresses (issue 49: a start-order offset of that size read 'regression')."""
    rng = random.Random(11)
    small = band_passes(rng, "b", 8, effect_b=-0.007, noise=0.0005)
    assert S.analyse_band("b", small, 8, 1, S.GateParams()).verdict is S.Verdict.REGRESSION
    within = S.analyse_band("b", small, 8, 1, S.GateParams(min_effect=0.01))
    assert within.verdict is S.Verdict.NEUTRAL and "within margin: -0.7" in within.reason
    assert not S.undecided(within, 0.03, 0.05)  # decided: no more rounds for it
    big = band_passes(rng, "b", 8, effect_b=-0.03, noise=0.0005)
    assert S.analyse_band("b", big, 8, 1, S.GateParams(min_effect=0.01)).verdict is S.Verdict.REGRESSION
