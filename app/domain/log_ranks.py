"""Which rank logged a line of a server's one log file, from the prefix the server puts on its worker processes'
output, so the per-rank checks (engagement, JIT) read a log as servers really write it (issue 49).

- vLLM (vllm/utils decorate_logs -> _add_prefix) wraps each worker process's stdout and stderr, so every line a
  worker writes, AITER's included, starts "(NAME pid=PID) ", in cyan unless NO_COLOR. NAME: "Worker_TP1" (V1,
  setup_worker_process_title_and_logging: Worker[_DPd][_PPp][_TPt][_EPe], plain "Worker" at one rank),
  "VllmWorker rank=1" (earlier V1), "VllmWorkerProcess" (V0: rank unnamed, the pid tells the process).
- SGLang (configure_logger's format "[%(asctime)s{prefix}] ", the scheduler's prefix " TP1", " DP0 TP1", " PP0
  TP1" ...) puts the ranks inside the bracket that opens the line.

A rank is named by its tensor-parallel index where that is all the prefix holds ("1"), else by its parts
("DP0_TP1", "pid1234"). Every other line (the server's main process, its API server and engine core, a
single-process server running the model itself) belongs to rank "0": vLLM V0's driver worker is rank 0 and logs
unprefixed."""

from __future__ import annotations

import re

MAIN = "0"
_ANSI = r"(?:\x1b\[[0-9;]*m)?"
_VLLM = re.compile(_ANSI + r"\((?P<name>[A-Za-z]*Worker[A-Za-z]*)(?P<parts>(?:_[A-Z]+\d+)*)"
                   r"(?: rank=(?P<rank>\d+))? pid=(?P<pid>\d+)\)" + _ANSI + " ")
_SGLANG = re.compile(r"\[\d[\d:\- .]*?(?P<parts>(?: (?:DP|PP|TP|EP|CP)\d+)+)\] ")


def _name(parts: list[str]) -> str:
    """("TP1",) -> "1"; several parts -> joined; no parts -> the main rank."""
    if len(parts) == 1 and parts[0].startswith("TP"):
        return parts[0][2:]
    return "_".join(parts) if parts else MAIN


def rank_of(line: str) -> str:
    m = _VLLM.match(line)
    if m:
        if m["rank"] is not None:
            return m["rank"]
        parts = [p for p in m["parts"].split("_") if p]
        if parts:
            return _name(parts)
        return MAIN if m["name"] == "Worker" else f"pid{m['pid']}"  # "Worker": one rank; V0's processes by pid
    m = _SGLANG.match(line)
    if m:
        return _name(m["parts"].split())
    return MAIN


def split(text: str) -> dict[str, str]:
    """One file's lines by rank, in order (the main rank first, present even where it logged nothing)."""
    out: dict[str, list[str]] = {MAIN: []}
    for line in text.splitlines(keepends=True):
        out.setdefault(rank_of(line), []).append(line)
    return {r: "".join(lines) for r, lines in out.items()}


def by_rank(texts: dict[str, str], expect: int = 1) -> dict[str, str]:
    """Logs as posted (a file per rank keyed by rank, or one file keyed "0") split by their lines' prefixes; a
    line that names no rank stays with its file. expect: the ranks the server runs; where the ranks are plain
    indexes, each of 0..expect-1 is present (a rank that logged nothing must show, not vanish)."""
    out: dict[str, list[str]] = {}
    for key, text in texts.items():
        for rank, part in split(text).items():
            out.setdefault(key if rank == MAIN else rank, []).append(part)
    if all(r.isdigit() for r in out):
        for r in range(expect):
            out.setdefault(str(r), [])
    return {r: "".join(parts) for r, parts in sorted(out.items(), key=lambda x: (len(x[0]), x[0]))}
