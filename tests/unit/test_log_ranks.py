"""Ranks told apart in one server log by the prefixes vLLM and SGLang put on their worker processes' lines."""

from __future__ import annotations

from app.domain import log_ranks
from app.domain.ab_gate import engagement
from app.domain.families import FAMILIES
from tests.unit.test_ab_gate import hit

CYAN, RESET = "\x1b[1;36m", "\x1b[0;0m"  # vllm/utils: CYAN, RESET around the prefix unless NO_COLOR
ROWS = [{"M": "2", "N": "4096", "K": "4096", "bias": "False", "dtype": "torch.bfloat16",
         "outdtype": "torch.bfloat16", "scaleAB": "False", "bpreshuffle": "False"}]
HIT = "[aiter] shape is M:2, N:4096, K:4096 ... is tuned on cu_num = 304"


def test_vllm_worker_prefixes_name_the_rank():
    assert log_ranks.rank_of(f"(Worker_TP1 pid=4242) {HIT}") == "1"
    assert log_ranks.rank_of(f"{CYAN}(Worker_TP3 pid=77){RESET} {HIT}") == "3"  # coloured
    assert log_ranks.rank_of(f"(VllmWorker rank=2 pid=9) {HIT}") == "2"  # earlier V1
    assert log_ranks.rank_of(f"(Worker_PP1_TP0 pid=9) {HIT}") == "PP1_TP0"  # pipeline and tensor parallel
    assert log_ranks.rank_of(f"(Worker_DP1_TP1 pid=9) {HIT}") == "DP1_TP1"
    assert log_ranks.rank_of(f"(Worker pid=9) {HIT}") == "0"  # one rank
    assert log_ranks.rank_of(f"(VllmWorkerProcess pid=31) {HIT}") == "pid31"  # V0: the process, by pid


def test_other_processes_and_plain_lines_are_the_main_rank():
    for line in (f"(EngineCore_DP0 pid=5) {HIT}", f"(APIServer pid=4) INFO started", HIT,
                 "INFO 12-07 03:00:00 [api_server.py:1] vLLM API server version 0.11"):
        assert log_ranks.rank_of(line) == "0", line


def test_sglang_brackets_name_the_rank():
    assert log_ranks.rank_of(f"[2026-12-07 03:00:00 TP1] {HIT}") == "1"
    assert log_ranks.rank_of(f"[12-07 03:00:00 TP0] {HIT}") == "0"
    assert log_ranks.rank_of(f"[2026-12-07 03:00:00 DP1 TP1] {HIT}") == "DP1_TP1"
    assert log_ranks.rank_of(f"[2026-12-07 03:00:00] {HIT}") == "0"  # the tokenizer manager, no rank


def test_one_file_splits_by_rank_and_an_expected_rank_that_logged_nothing_shows():
    text = "(APIServer pid=4) up\n(Worker_TP0 pid=6) a\n(Worker_TP1 pid=7) b\n(Worker_TP0 pid=6) c\n"
    got = log_ranks.by_rank({"0": text}, expect=2)
    assert got == {"0": "(APIServer pid=4) up\n(Worker_TP0 pid=6) a\n(Worker_TP0 pid=6) c\n",
                   "1": "(Worker_TP1 pid=7) b\n"}
    assert log_ranks.by_rank({"0": "(Worker_TP0 pid=6) a\n"}, expect=2)["1"] == ""  # present, empty
    # named ranks are not filled with plain indexes that would read as silent ranks
    assert set(log_ranks.by_rank({"0": "(Worker_PP1_TP0 pid=6) a\n"}, expect=2)) == {"0", "PP1_TP0"}


def test_a_file_per_rank_keeps_its_rank():
    assert log_ranks.by_rank({"0": "x\n", "1": "y\n"}, expect=2) == {"0": "x\n", "1": "y\n"}


def test_engagement_reads_each_rank_of_one_vllm_log():
    """The gate's engagement check on one file as vLLM writes it at tensor parallel 2: a rank whose lines hold no
    hit is named, though both ranks share the file."""
    fam = FAMILIES["bf16_gemm"]
    both = "".join(f"(Worker_TP{r} pid={10 + r}) {line}\n" for r in (0, 1) for line in hit(2, 2).splitlines())
    ok = engagement({"bf16_gemm": (fam, ROWS)}, log_ranks.by_rank({"0": both}, 2), {})
    assert ok.ok and [r.rank for r in ok.ranks] == ["0", "1"]
    only0 = "".join(f"(Worker_TP0 pid=10) {line}\n" for line in hit(2, 2).splitlines())
    bad = engagement({"bf16_gemm": (fam, ROWS)}, log_ranks.by_rank({"0": only0}, 2), {})
    assert not bad.ok and "rank 1 logged no hit line" in bad.reason


def test_the_gate_names_the_rank_that_compiled_in_a_window_of_one_vllm_log():
    fam = FAMILIES["bf16_gemm"]
    start = "".join(f"(Worker_TP{r} pid={10 + r}) {line}\n" for r in (0, 1) for line in hit(2, 2).splitlines())
    window = "(Worker_TP1 pid=11) [aiter] start build [module_gemm] under /tmp/jit\n(Worker_TP0 pid=10) ok\n"
    got = engagement({"bf16_gemm": (fam, ROWS)}, log_ranks.by_rank({"0": start}, 2),
                     log_ranks.by_rank({"0": window}, 2))
    assert not got.ok and "rank 1 compiled in the measured window (aiter: 1 line(s))" in got.reason
    assert "rank 0 compiled" not in got.reason
