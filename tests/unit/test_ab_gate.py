"""The serving A/B's checks besides statistics: engagement from AITER's own log lines per rank, JIT compile lines,
the accuracy check, which rows serve a band (the rollback), and the default operating points."""

from __future__ import annotations

from app.ab_load import _answer
from app.ab_wire import Answer, OperatingPoint
from app.domain import ab_gate as G
from app.domain.families import FAMILIES

BF16 = FAMILIES["bf16_gemm"]
N = K = 4096


def row(m, n=N, k=K):
    return {"gfx": "gfx942", "cu_num": "304", "M": str(m), "N": str(n), "K": str(k), "bias": "False",
            "dtype": "torch.bfloat16", "outdtype": "torch.bfloat16", "scaleAB": "False", "bpreshuffle": "False",
            "libtype": "hipblaslt", "solidx": "1", "splitK": "0", "us": "5.0", "kernelName": "k", "err_ratio": "0",
            "tflops": "1", "bw": "1"}


def hit(m, padded, n=N, k=K, file="/ov/svc_bf16_tuned_gemm.csv"):
    """tuned_gemm.py:183's line, rendered with AITER's f-string (ROCm/aiter e4048607a5)."""
    dtype = otype = "torch.bfloat16"
    bias = scaleAB = bpreshuffle = False
    return (f"[aiter] shape is M:{m}, N:{n}, K:{k} {dtype=} {otype=} {bias=}, {scaleAB=}, {bpreshuffle=} found "
            f"padded_M: {padded}, N:{n}, K:{k} is tuned on cu_num = 304 in {file}, libtype is hipblaslt, "
            f"kernel name is k\n")


def miss(m, n=N, k=K):
    dtype = otype = "torch.bfloat16"
    bias = scaleAB = bpreshuffle = False
    return (f"[aiter] shape is M:{m}, N:{n}, K:{k} {dtype=} {otype=} {bias=}, {scaleAB=}, {bpreshuffle=}, not found "
            f"tuned config in /x.csv, will use default config! using torch solution:0\n")


ROWS = [row(1), row(2), row(32), row(64)]
FAMS = {"bf16_gemm": (BF16, ROWS)}


def test_every_rank_hitting_the_versions_rows_engages():
    logs = {"0": hit(2, 2) + hit(32, 32), "1": hit(2, 2) + hit(32, 32) + miss(8)}
    e = G.engagement(FAMS, logs, {"0": "", "1": ""})
    assert e.ok and [r.rows_hit for r in e.ranks] == [[1, 2], [1, 2]] and e.ranks[1].misses == 1


def test_a_rank_without_hit_lines_of_the_versions_rows_voids_naming_the_rank():
    logs = {"0": hit(2, 2), "1": miss(2) + hit(100, 100)}  # rank 1 hit a row the version does not hold
    e = G.engagement(FAMS, logs, {})
    assert not e.ok and "rank 1 logged no hit line for the version's rows" in e.reason
    assert e.ranks[1].other_hits == 1


def test_no_hit_is_expected_where_no_row_serves_the_runs_batch_sizes():
    e = G.engagement({"bf16_gemm": (BF16, [row(64)])}, {"0": miss(2), "1": miss(2)}, {}, list(range(1, 17)))
    assert e.ok and "no hit expected" in e.note
    e = G.engagement({"bf16_gemm": (BF16, [row(2), row(64)])}, {"0": miss(2), "1": miss(2)}, {}, [1, 2])
    assert not e.ok


def test_a_compile_in_the_measured_window_voids():
    logs = {"0": hit(2, 2)}
    win = {"0": "[aiter] start build [module_gemm_a16w16] under /tmp/jit\n"}
    e = G.engagement(FAMS, logs, win)
    assert not e.ok and "compiled in the measured window (aiter: 1 line(s))" in e.reason
    assert G.jit_lines("Triton autotuning for function _gemm\nFlyDSL kernel compiled in 3s\n") == {
        "aiter": 0, "triton": 1, "flydsl": 1}


def test_ranks_on_different_rows_void():
    e = G.engagement(FAMS, {"0": hit(2, 2) + hit(32, 32), "1": hit(2, 2)}, {})
    assert not e.ok and "ranks hit different rows" in e.reason


def acc(answers):
    return G.accuracy(answers)[0]


def ans(tokens, logprobs=None, runner_up=None):
    return Answer(tokens=tokens, logprobs=logprobs or [-0.1] * len(tokens), runner_up=runner_up or [-3.0] * len(tokens))


# four prompts; A's top two are near-tied (0.05 nats) at prompt 3's second token
A4 = [ans(["Paris", "."]), ans(["\n", "if"]), ans(["8", ","]), ans(["good", "day"], [-0.1, -0.70], [-3.0, -0.75])]


def test_accuracy_within_tolerance_passes_and_a_changed_answer_fails():
    assert acc({"A": A4, "A_prime": A4, "B": A4}) is None
    b = A4[:1] + [ans(["\n", "return"])] + A4[2:]  # A's gap there: 2.9 nats, so B changed the answer
    assert acc({"A": A4, "A_prime": A4, "B": b}) == (
        "accuracy: arm B: 1 prompt(s) answered otherwise than A (first: prompt 1 at token 1; A's top-two gap 2.90 "
        "nats > 0.1)")
    assert "arm B's answers were not posted" in acc({"A": A4, "A_prime": A4})


def test_a_flip_between_near_tied_tokens_is_within_tolerance_and_a_logprob_shift_is_not():
    flip = A4[:3] + [ans(["good", "morning"], [-0.1, -0.75], [-3.0, -0.70])]
    assert acc({"A": A4, "A_prime": A4, "B": flip}) is None  # 1 of 4 flipped at a 0.05-nat tie: 25%
    check = G.check_answers(A4, flip)
    assert check.flips == 1 and check.departed == [] and check.shifted == []
    two = flip[:2] + [ans(["8", ","], [-0.1, -0.1], [-0.15, -3.0])] + flip[3:]
    a_two = A4[:2] + [ans(["9", ","], [-0.1, -0.1], [-0.15, -3.0])] + A4[3:]
    assert acc({"A": a_two, "A_prime": a_two, "B": two}) == (
        "accuracy: arm B: 2 of 4 prompts flipped at a near tie (at most 25%)")
    moved = [ans(x.tokens, [v - 0.15 for v in x.logprobs], x.runner_up) for x in A4]
    assert acc({"A": A4, "A_prime": A4, "B": moved}).startswith(
        "accuracy: arm B: 4 prompt(s) whose tokens' logprobs moved more than 0.1 nats")
    within = [ans(x.tokens, [v - 0.05 for v in x.logprobs], x.runner_up) for x in A4]
    assert acc({"A": A4, "A_prime": A4, "B": within}) is None


def test_at_a_near_tie_only_a_runner_up_is_a_flip_and_a_shorter_answer_departs():
    a = A4[:3] + [Answer(tokens=["good", "day"], logprobs=[-0.1, -0.70], runner_up=[-3.0, -0.75],
                         runner_up_tokens=["bad", "morning"])]
    assert acc({"A": a, "A_prime": a, "B": A4[:3] + [ans(["good", "morning"])]}) is None
    assert acc({"A": a, "A_prime": a, "B": A4[:3] + [ans(["good", "night"])]}) == (
        "accuracy: arm B: 1 prompt(s) answered otherwise than A (first: prompt 3 at token 1; 'night' is neither A's "
        "token nor its runner-up 'morning')")
    assert acc({"A": a, "A_prime": a, "B": A4[:3] + [ans(["good"])]}) == (
        "accuracy: arm B: 1 prompt(s) answered otherwise than A (first: prompt 3 at token 1; 1 tokens, A 2)")


def test_a_control_that_answers_otherwise_says_the_servers_do_not_answer_alike():
    b = A4[:1] + [ans(["\n", "return"])] + A4[2:]
    assert acc({"A": A4, "A_prime": b, "B": A4}).endswith("(A's own files: the servers do not answer alike)")


def test_tokens_without_logprobs_must_equal_as_they_did():
    """A run posted before answers carried logprobs: its tokens only, so any departure fails (no gap to judge)."""
    a = [Answer(tokens=["Paris", "."]), Answer(tokens=["\n", "if"])]
    assert acc({"A": a, "A_prime": a, "B": a}) is None
    b = [a[0], Answer(tokens=["\n", "return"])]
    assert "first: prompt 1 at token 1; A's logprobs there are unknown" in acc({"A": a, "A_prime": a, "B": b})


def test_the_answer_of_a_vllm_completion_choice():
    """vLLM lists the chosen token beside its top n: the runner-up is the best of the others."""
    choice = {"text": " Paris.", "logprobs": {"tokens": [" Paris", "."], "token_logprobs": [-0.2, -1.1],
                                              "top_logprobs": [{" Paris": -0.2, " Lyon": -2.5, " the": -3.0},
                                                               {",": -0.9, ".": -1.1}]}}
    got = _answer(choice)
    assert got.tokens == [" Paris", "."] and got.logprobs == [-0.2, -1.1] and got.runner_up == [-2.5, -0.9]
    assert got.runner_up_tokens == [" Lyon", ","]
    assert _answer({"text": "x", "logprobs": None}) == Answer(tokens=["x"])


def test_rows_serving_a_band_follow_aiters_padded_m_tries():
    # bf16 GEMM tries raw M, then 16-multiples (gl0), then the next power of two (gl1): tuned_gemm.py
    assert G.rows_serving(BF16, ROWS, [2]) == [1]
    assert G.rows_serving(BF16, ROWS, [32]) == [2]
    assert G.rows_serving(BF16, ROWS, [8]) == []
    assert G.rows_serving(BF16, [row(16), row(8)], [1]) == [0]  # M=1 pads to 16 (gl0)
    assert G.rows_serving(BF16, [row(2, n=1024)], [2]) == [0]


def test_bands_split_the_batch_axis_at_their_concurrencies():
    pts = [OperatingPoint(concurrency=c, input_len=8, output_len=8) for c in (2, 8, 32)]
    assert [G.batch_sizes(p, pts) for p in pts] == [[1, 2], list(range(3, 9)), list(range(9, 33))]
    assert G.rows_serving(BF16, ROWS, G.batch_sizes(pts[0], pts)) == [0, 1]  # M=1 and M=2, not 32 or 64
    assert G.rows_serving(BF16, ROWS, G.batch_sizes(pts[1], pts)) == []
    assert G.rows_serving(BF16, ROWS, G.batch_sizes(pts[2], pts)) == [2]  # 9..16 pad to 16, 17..32 to 32


def test_default_points_from_the_captured_tokens_per_step_histogram():
    hist = {"1": 100, "8": 10, "16": 500, "64": 300, "+Inf": 90}
    pts = G.default_points(hist, 256, 64)
    assert [p.concurrency for p in pts] == [1, 16, 64] and pts[0] == OperatingPoint(concurrency=1, input_len=256,
                                                                                    output_len=64)
    assert [p.concurrency for p in G.default_points({"16": 10, "+Inf": 90})] == [16, 32]  # +Inf: 2x the top bound
    assert [p.concurrency for p in G.default_points(None)] == list(G.DEFAULT_CONCURRENCY)


def test_default_lengths_are_the_served_medians_as_histogram_quantile_reads_them():
    """Prometheus's histogram_quantile: linear inside the bucket holding the median; +Inf: the top finite bound."""
    hist = {"prompt": {"100": 10, "200": 30, "500": 10}, "generation": {"50": 20, "100": 30}}
    assert G.default_lengths(hist) == (150, 58)
    assert G.default_lengths({"prompt": {"1000": 1, "+Inf": 9}}) == (1000, None)
    assert G.default_lengths({"prompt": {"2": 0}}) == (None, None) and G.default_lengths(None) == (None, None)


def test_a_band_may_ask_for_its_own_requests_per_pass():
    from app.ab_wire import OperatingPoint
    from app.services.ab import n_requests
    assert n_requests(8, OperatingPoint(concurrency=2, input_len=16, output_len=12, requests=20)) == 20
    assert n_requests(8, OperatingPoint(concurrency=2, input_len=16, output_len=12)) == 8
    assert n_requests(8, OperatingPoint(concurrency=16, input_len=16, output_len=12, requests=4)) == 16
    assert OperatingPoint(concurrency=2, input_len=16, output_len=12, requests=20).name == "c2-i16-o12"
