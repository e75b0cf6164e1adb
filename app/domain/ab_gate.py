"""The serving A/B's checks besides the statistics (issue 32), pure: did arm B engage (hit lines for the version's
rows from every rank, no JIT compile in the measured windows), did it answer like A (greedy answers, within a
stated tolerance), which rows serve a band's batch sizes (the rollback), and the operating points a run measures
by default."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.ab_wire import Answer, OperatingPoint
from app.domain.families import TableFamily
from app.domain.keys import m_candidates, runtime_value
from app.domain.log_lines import parse_log

# A compile in the measured window means the arm measured a build, not its kernels. The lines each compiler prints:
# AITER's JIT "start build [module] under dir" (aiter/jit/core.py:888); Triton's autotuner when
# TRITON_PRINT_AUTOTUNING=1 ("Triton autotuning for function ...", triton/runtime/autotuner.py); FlyDSL's
# compile lines (any line naming flydsl and a compile).
JIT_LINES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("aiter", re.compile(r"start build \[[^\]]+\]")),
    ("triton", re.compile(r"Triton autotuning for function")),
    ("flydsl", re.compile(r"(?i)flydsl.*compil|compil.*flydsl")),
)


def jit_lines(text: str) -> dict[str, int]:
    out = {name: 0 for name, _ in JIT_LINES}
    for line in text.splitlines():
        for name, pat in JIT_LINES:
            if pat.search(line):
                out[name] += 1
                break
    return out


def _norm(col: str, v: object) -> object:
    return runtime_value(col, str(v))


def _row_ids(family: TableFamily, rows: Sequence[Mapping[str, str]]) -> dict[tuple[object, tuple[object, ...]], int]:
    """Each row by (M as tabled, its other shape cells), as runtime values: what a hit line names."""
    cols = [c for c in family.shape_columns if c != family.m_column]
    out = {}
    for i, r in enumerate(rows):
        m = _norm(family.m_column, r.get(family.m_column, "")) if family.m_column else None
        out[(m, tuple(_norm(c, r.get(c, "")) for c in cols))] = i
    return out


@dataclass
class RankEngagement:
    rank: str
    hits: int = 0  # hit lines of the version's rows (startup, warm-up and windows)
    rows_hit: list[int] = field(default_factory=list)  # which rows (indexes into the family's rows)
    other_hits: int = 0  # hit lines of rows the version does not hold (shipped rows)
    misses: int = 0
    jit: dict[str, int] = field(default_factory=dict)  # compile lines in the measured windows


@dataclass
class Engagement:
    ok: bool
    reason: str | None
    ranks: list[RankEngagement]
    note: str | None = None


def _hit_key(fam: TableFamily, ev: Any) -> tuple[object, tuple[object, ...]]:
    """The row a hit line names: (the M it was found at, the other shape cells), as runtime values."""
    shape = dict(ev.shape)
    for col, default in fam.shape_defaults:  # a cell the line printed as None (app/domain/shapes.py)
        shape.setdefault(col, shape.get(default, default))
    # the M the row was found at: the padded M the hit line prints, else the shape's (an exact lookup)
    m = ev.padded_m if ev.padded_m is not None else (shape.get(fam.m_column) if fam.m_column else None)
    return (_norm(fam.m_column, str(m)) if fam.m_column and m is not None else None,
            tuple(_norm(c, shape.get(c, "")) for c in fam.shape_columns if c != fam.m_column))


def _rank_engagement(rank: str, log: str, window: str,
                     families: Mapping[str, tuple[TableFamily, Sequence[Mapping[str, str]]]],
                     ids: Mapping[str, dict[tuple[object, tuple[object, ...]], int]]) -> RankEngagement:
    """One rank's hit lines of the version's rows (in its whole log) and compile lines (in its windows)."""
    re_ = RankEngagement(rank, jit=jit_lines(window))
    hit_rows: set[tuple[str, int]] = set()
    for ev in parse_log(log).events:
        if ev.family not in families:
            continue
        if not ev.hit:
            re_.misses += 1
            continue
        i = ids[ev.family].get(_hit_key(families[ev.family][0], ev))
        if i is None:
            re_.other_hits += 1
        else:
            re_.hits += 1
            hit_rows.add((ev.family, i))
    re_.rows_hit = sorted(i for _, i in hit_rows)
    return re_


def _not_engaged(ranks: Sequence[RankEngagement], expect: bool) -> list[str]:
    why = []
    if not ranks:
        why.append("no server log from any rank")
    for r in ranks:
        if r.hits == 0 and expect:
            why.append(f"rank {r.rank} logged no hit line for the version's rows (its files did not take: "
                       "a rank on other tables)")
        compiled = {k: v for k, v in r.jit.items() if v}
        if compiled:
            why.append(f"rank {r.rank} compiled in the measured window "
                       f"({', '.join(f'{k}: {v} line(s)' for k, v in compiled.items())})")
    if len(ranks) > 1 and len({tuple(r.rows_hit) for r in ranks}) > 1:
        why.append("ranks hit different rows of the version: " +
                   ", ".join(f"rank {r.rank}: {len(r.rows_hit)} row(s)" for r in ranks))
    return why


def engagement(families: Mapping[str, tuple[TableFamily, Sequence[Mapping[str, str]]]],
               logs: Mapping[str, str], windows: Mapping[str, str], sizes: Sequence[int] | None = None
               ) -> Engagement:
    """families: name -> (family, the version's own rows); logs: rank -> every line the arm logged (start, warm-up
    and measured windows: AITER logs a hit once per shape per process, lru_cache'd, so it may come before the
    window); windows: rank -> the measured windows only (where a compile must not happen). sizes: the batch sizes
    the run's bands serve: a version none of whose rows serves one is not expected to log a hit (its rows are not
    exercised by this run, which then measures B as A; said in the reason-free note)."""
    ids = {name: _row_ids(fam, rows) for name, (fam, rows) in families.items()}
    ranks = [_rank_engagement(rank, logs.get(rank, ""), windows.get(rank, ""), families, ids)
             for rank in sorted(set(logs) | set(windows), key=lambda r: (len(r), r))]
    expect = sizes is None or any(rows_serving(fam, rows, sizes) for fam, rows in families.values())
    why = _not_engaged(ranks, expect)
    return Engagement(not why, "B did not engage: " + "; ".join(why) if why else None, ranks,
                      None if expect else "no row of the version serves the run's batch sizes: no hit expected")


# The accuracy check's tolerance. A tuned GEMM changes rounding (another tile order, another accumulation split), not
# what is computed: the logprob of a token both arms chose moves by hundredths of a nat in bf16, and a greedy
# choice can flip only where A's top two tokens were nearly tied; past a flip the two continuations are different
# texts and are not compared. So, against A's answer to each prompt:
TIE_NATS = 0.1  # a departure is a near-tie flip when A's own top-two gap at that token was at most this
LOGPROB_TOL = 0.1  # the tokens both chose: mean |logprob(arm) - logprob(A)| at most this (nats)
MAX_FLIP_FRAC = 0.25  # at most this share of the prompts may flip at a near tie (more: the kernel moves answers)


@dataclass(frozen=True)
class AnswerCheck:
    """One arm's answers against A's: prompts that departed other than by a near-tie flip (index, token, why),
    prompts whose shared tokens' logprobs moved past LOGPROB_TOL (index, mean shift), near-tie flips."""

    departed: list[tuple[int, int, str]]
    shifted: list[tuple[int, float]]
    flips: int
    prompts: int

    def failure(self) -> str | None:
        if self.departed:
            i, j, why = self.departed[0]
            return f"{len(self.departed)} prompt(s) answered otherwise than A (first: prompt {i} at token {j}; {why})"
        if self.shifted:
            i, d = max(self.shifted, key=lambda x: x[1])
            return (f"{len(self.shifted)} prompt(s) whose tokens' logprobs moved more than {LOGPROB_TOL} nats "
                    f"(most: prompt {i}, {d:.3f})")
        if self.flips > MAX_FLIP_FRAC * self.prompts:
            return f"{self.flips} of {self.prompts} prompts flipped at a near tie (at most {MAX_FLIP_FRAC:.0%})"
        return None


def _at(xs: Sequence[Any], j: int) -> Any:
    return xs[j] if j < len(xs) else None


def _departure(pa: Answer, px: Answer, j: int) -> str | None:
    """Why the arm's answer leaving A's at token j is not a near-tie flip (None: it is one): A's top two there
    were further apart than TIE_NATS, or the arm chose neither A's token nor A's runner-up."""
    lp, ru = _at(pa.logprobs, j), _at(pa.runner_up, j)
    if lp is None or ru is None:
        return "A's logprobs there are unknown"
    if lp - ru > TIE_NATS:
        return f"A's top-two gap {lp - ru:.2f} nats > {TIE_NATS}"
    alt = _at(pa.runner_up_tokens, j)
    if alt is not None and px.tokens[j] != alt:
        return f"{px.tokens[j]!r} is neither A's token nor its runner-up {alt!r}"
    return None


def check_answers(a: Sequence[Answer], x: Sequence[Answer]) -> AnswerCheck:
    departed: list[tuple[int, int, str]] = []
    shifted, flips = [], 0
    for i, (pa, px) in enumerate(zip(a, x)):
        if len(pa.tokens) != len(px.tokens):
            departed.append((i, min(len(pa.tokens), len(px.tokens)), f"{len(px.tokens)} tokens, A {len(pa.tokens)}"))
            continue
        j = next((k for k, (u, v) in enumerate(zip(pa.tokens, px.tokens)) if u != v), len(pa.tokens))
        if j < len(pa.tokens):
            if why := _departure(pa, px, j):
                departed.append((i, j, why))
                continue
            flips += 1
        diffs = [abs(u - v) for u, v in zip(pa.logprobs[:j], px.logprobs[:j]) if u is not None and v is not None]
        if diffs and sum(diffs) / len(diffs) > LOGPROB_TOL:
            shifted.append((i, sum(diffs) / len(diffs)))
    return AnswerCheck(departed, shifted, flips, len(a))


def accuracy(answers: Mapping[str, Sequence[Answer] | None]) -> tuple[str | None, dict[str, AnswerCheck]]:
    """The arms' greedy answers to the accuracy prompts (app/ab_prompts.py): B's and the control's must agree with
    A's within the tolerance above (a kernel that changes an answer where A was sure of it, or moves the logprobs,
    changes what is computed). The control runs A's files: where it fails, the servers themselves do not answer
    alike, and the check cannot vouch for B. (why it fails, None where they agree; each arm's check)."""
    a = answers.get("A")
    if not a:
        return "accuracy: arm A's answers were not posted", {}
    checks: dict[str, AnswerCheck] = {}
    for arm in ("A_prime", "B"):
        x = answers.get(arm)
        if not x:
            return f"accuracy: arm {arm}'s answers were not posted", checks
        if len(x) != len(a):
            return f"accuracy: arm {arm} answered {len(x)} prompts, A {len(a)}", checks
        checks[arm] = check_answers(a, x)
        if why := checks[arm].failure():
            return f"accuracy: arm {arm}: {why}" + (" (A's own files: the servers do not answer alike)"
                                                    if arm == "A_prime" else ""), checks
    return None, checks


def batch_sizes(point: OperatingPoint, points: Sequence[OperatingPoint]) -> list[int]:
    """The batch sizes a band serves: the bands split the batch axis at their concurrencies, each taking the sizes
    above the next lower band's up to its own. A band keeps `concurrency` requests in flight, so its decode steps
    run that many sequences, and fewer while a pass starts and drains (down to 1 in the lowest band)."""
    below = [p.concurrency for p in points if p.concurrency < point.concurrency]
    return list(range(max(below, default=0) + 1, point.concurrency + 1))


def rows_serving(family: TableFamily, rows: Sequence[Mapping[str, str]], sizes: Iterable[int]) -> list[int]:
    """Indexes of rows AITER may pick for a call at any of these batch sizes: the row's M is one of the Ms AITER
    tries for that call (keys.m_candidates: raw M, then the family's padded buckets), its other cells the row's."""
    if family.m_column is None:
        return list(range(len(rows)))  # no M in the key: every row serves every batch size
    out = []
    sizes = list(sizes)
    for i, r in enumerate(rows):
        m = _norm(family.m_column, r.get(family.m_column, ""))
        for b in sizes:
            shape = {c: str(r.get(c, "")) for c in family.shape_columns}
            shape[family.m_column] = str(b)
            if m in m_candidates(family, shape):
                out.append(i)
                break
    return out


# Defaults when the image has no captured served load (the capture agent reads vLLM's tokens-per-step histogram
# and its prompt/generation length histograms: app/capture/metrics.py)
DEFAULT_CONCURRENCY = (1, 16, 64)
DEFAULT_INPUT_LEN = 512
DEFAULT_OUTPUT_LEN = 128


def _bucket_at(finite: Sequence[tuple[float, float]], total: float, q: float, top: float) -> float:
    """The upper bound of the bucket holding the q-quantile of steps (top: past every finite bucket)."""
    acc = 0.0
    for b, v in finite:
        acc += v
        if acc >= q * total:
            return b
    return top


def _quantile(hist: Mapping[str, float], q: float) -> float | None:
    """Prometheus's histogram_quantile: the q-quantile of counts per bucket (upper bounds, not cumulative),
    linear inside its bucket; in the +Inf bucket, the largest finite bound."""
    buckets = sorted((float(k), v) for k, v in hist.items() if v > 0)
    total = sum(v for _, v in buckets)
    if not total:
        return None
    acc, lo = 0.0, 0.0
    for b, v in buckets:
        if acc + v >= q * total:
            return lo if b == float("inf") else lo + (b - lo) * (q * total - acc) / v
        acc, lo = acc + v, b
    return lo


def default_lengths(length_hist: Mapping[str, Mapping[str, float]] | None) -> tuple[int | None, int | None]:
    """The served median prompt and generation lengths (vLLM's vllm:request_prompt_tokens and
    vllm:request_generation_tokens, summed over captures), or None where nothing was captured."""
    out = []
    for kind in ("prompt", "generation"):
        v = _quantile((length_hist or {}).get(kind) or {}, 0.5)
        out.append(max(1, round(v)) if v is not None else None)
    return out[0], out[1]


def default_points(step_hist: Mapping[str, float] | None, input_len: int = DEFAULT_INPUT_LEN,
                   output_len: int = DEFAULT_OUTPUT_LEN, bands: int = 3) -> list[OperatingPoint]:
    """Concurrency bands from the image's served load: vLLM's tokens-per-step histogram (steps per bucket, summed
    over captures; a decode step's tokens are its running sequences) read at the 10th, 50th and 90th percentile of
    steps, each at its bucket's upper bound (the +Inf bucket: twice the largest finite bound)."""
    hist = step_hist or {}
    total = sum(v for v in hist.values() if v > 0)
    if not total:
        return [OperatingPoint(concurrency=c, input_len=input_len, output_len=output_len)
                for c in DEFAULT_CONCURRENCY]
    finite = sorted((float(k), v) for k, v in hist.items() if k != "+Inf" and v > 0)
    bounds = sorted(float(k) for k in hist if k != "+Inf")
    top = 2 * bounds[-1] if bounds else 64.0
    qs = [0.1, 0.5, 0.9] if bands == 3 else [(i + 0.5) / bands for i in range(bands)]
    cs = {max(1, min(4096, int(_bucket_at(finite, total, q, top)))) for q in qs}
    return [OperatingPoint(concurrency=c, input_len=input_len, output_len=output_len) for c in sorted(cs)]
