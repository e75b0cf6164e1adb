"""The serving A/B's wire format (issue 32): the operating points a run measures and the per-request records its
driver posts. One module the service, the driver (beside the servers) and the load generator all import; pydantic
only, like app/wire.py, so the driver runs in a serving image without the service's dependencies."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# The arms of every run: A is the baseline (shipped tables only, or the promoted overlay), A_prime the identical-arm
# control (A's files exactly: an effect between A and A_prime is noise, and voids the run), B the version under test.
Arm = Literal["A", "A_prime", "B"]
ARMS: tuple[Arm, ...] = ("A", "A_prime", "B")
BAND_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class OperatingPoint(BaseModel):
    """One band: a concurrency level at one input/output length. `requests`: this band's requests per pass, where
    it needs its own (a band at concurrency 2 decodes 1/8 of the tokens a band at 16 does in the same seconds, so
    it needs more requests per pass for the same interval); unset, the run's requests_per_pass."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    concurrency: int = Field(ge=1, le=4096)
    input_len: int = Field(ge=1, le=1_000_000)
    output_len: int = Field(ge=1, le=1_000_000)
    requests: int | None = Field(default=None, ge=1, le=100_000)

    @property
    def name(self) -> str:
        return f"c{self.concurrency}-i{self.input_len}-o{self.output_len}"

    def short_stream(self, got: int) -> str | None:
        """A request that streamed fewer tokens than the band asks is an error, whichever load measured it."""
        return f"stream ended after {got} of {self.output_len} tokens" if got < self.output_len else None


class RequestRecord(BaseModel):
    """One request as the load generator saw it. Times are seconds; `started_s` counts from the start of the run
    (the driver's monotonic clock), so the drift between passes can be seen and modelled."""

    model_config = ConfigDict(extra="forbid")

    arm: Arm
    band: str = Field(max_length=64)
    repeat: int = Field(ge=0, le=10_000)  # the round this request's pass ran in
    started_s: float = Field(ge=0, allow_inf_nan=False)
    ttft_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)  # None: no token came
    itl_s: list[float] = Field(default_factory=list, max_length=1_000_000)  # gaps between streamed tokens
    latency_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)  # request start to last token
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    error: str | None = Field(default=None, max_length=2000)  # None: the request completed

    @field_validator("band")
    @classmethod
    def _band(cls, v: str) -> str:
        if not BAND_NAME_RE.fullmatch(v):
            raise ValueError("a band name is 1-64 of A-Z a-z 0-9 _ . -")
        return v

    @field_validator("itl_s")
    @classmethod
    def _itl(cls, v: list[float]) -> list[float]:
        if any(not (x >= 0) or x == float("inf") for x in v):
            raise ValueError("inter-token latencies are finite and >= 0")
        return v


# ---- the service's A/B API bodies (the driver posts them) ---------------------------------------------------------

MAX_LOG_CHARS = 8_000_000  # one rank's log of one measured window
MAX_RECORDS = 100_000  # one pass


class VersionIn(BaseModel):
    """POST /v1/ab/versions: freeze the image's overlay as deployed in `form` (every family with rows, or these)."""

    model_config = ConfigDict(extra="forbid")

    image_digest: str = Field(max_length=80)
    form: Literal["layer", "merged"] = "layer"
    families: list[Annotated[str, Field(max_length=64)]] | None = Field(default=None, max_length=64)


class RunIn(BaseModel):
    """POST /v1/ab/runs. points: the bands (default: from the image's captured served load, else 1/16/64 at
    input_len/output_len). repeats: rounds per band, even (mirrored pairs, so linear drift cancels;
    the default 6 is one full cycle of ab_stats.ROUND_ORDERS, every arm in every position twice).
    requests_per_pass: per pass, at least the band's concurrency (the service raises it to that).
    max_repeats: sequential rounds: a band still undecided after `repeats` rounds (its interval holds 0 and its
    MDE is above target_mde, or it cannot rule out a loss above max_loss) is measured 6 rounds more at a time up to
    this many (default: repeats, a fixed design); every look's interval is at the run's confidence split over
    bands and looks (app/domain/ab_stats.py)."""

    model_config = ConfigDict(extra="forbid")

    image_digest: str = Field(max_length=80)
    version_id: int = Field(ge=1, le=2**62)
    baseline: str = Field(default="promoted", pattern=r"^(shipped|promoted|[0-9]{1,12})$")
    points: list[OperatingPoint] | None = Field(default=None, min_length=1, max_length=32)
    input_len: int | None = Field(default=None, ge=1, le=1_000_000)
    output_len: int | None = Field(default=None, ge=1, le=1_000_000)
    repeats: int = Field(default=6, ge=2, le=200)
    requests_per_pass: int = Field(default=32, ge=1, le=100_000)
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    power: float = Field(default=0.8, gt=0.5, lt=1)
    min_requests: int = Field(default=4, ge=1, le=100_000)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    # promotion needs every band's interval to rule out a throughput loss above this (0.05: 5%)
    max_loss: float = Field(default=0.05, gt=0, lt=1)
    max_repeats: int | None = Field(default=None, ge=2, le=200)
    target_mde: float = Field(default=0.03, gt=0, lt=1)
    # the smallest effect of interest: a significant effect smaller than this reads "neutral (within margin)", so
    # it neither blocks promotion nor proposes a rollback. 1%: below the gate's own resolution (its decode-rate
    # MDE medians were 2.0-2.5% over 40 gates, benchmarks/RESULTS.md) and below what one GEMM table's rows move
    # in a served step; a -0.7% start-order offset read "regression" in 3 of 3 held-out gates without it
    min_effect: float = Field(default=0.01, ge=0, lt=0.5)

    @field_validator("repeats", "max_repeats")
    @classmethod
    def _even(cls, v: int | None) -> int | None:
        if v is not None and v % 2:
            raise ValueError("rounds must be even: they come in mirrored pairs so a linear drift cancels")
        return v

    @model_validator(mode="after")
    def _max_at_least_repeats(self) -> RunIn:
        if self.max_repeats is not None and self.max_repeats < self.repeats:
            raise ValueError(f"max_repeats: {self.max_repeats} is below repeats ({self.repeats})")
        return self


class NodeProbe(BaseModel):
    """What the driver's host did during a pass, apart from the servers: how late its event loop woke from short
    sleeps (a stalled or oversubscribed node wakes everything late, the arms' servers too). The driver measures a
    pass again when its probe says the node stalled (app/ab_driver.py STALL_S); the verdict does not read it."""

    model_config = ConfigDict(extra="forbid")

    samples: int = Field(ge=0)
    lag_max_s: float = Field(ge=0, allow_inf_nan=False)
    lag_mean_s: float = Field(ge=0, allow_inf_nan=False)
    stalled_passes: int = Field(default=0, ge=0)  # earlier tries of this pass the node stalled in, not posted


class PassIn(BaseModel):
    """POST /v1/ab/runs/{id}/passes: one arm's measured window of one band in one round, whole."""

    model_config = ConfigDict(extra="forbid")

    band: str = Field(max_length=64)
    repeat: int = Field(ge=0, le=10_000)
    arm: Arm
    records: list[RequestRecord] = Field(max_length=MAX_RECORDS)
    logs: dict[str, str] = Field(default_factory=dict, max_length=512)  # rank -> the window's server log
    probe: NodeProbe | None = None
    # what measured the pass: "own" (the driver's loop), a preset's name ("vllm", "sglang") or "cmd: TEMPLATE"; one
    # run's passes all come from one load (a bench's overheads differ from the own loop's, so mixing would bias B)
    load: str = Field(default="own", min_length=1, max_length=300)

    @field_validator("logs")
    @classmethod
    def _logs(cls, v: dict[str, str]) -> dict[str, str]:
        for k, text in v.items():
            if not re.fullmatch(r"[A-Za-z0-9_.-]{1,32}", k):
                raise ValueError("a rank is 1-32 of A-Z a-z 0-9 _ . -")
            if len(text) > MAX_LOG_CHARS:
                raise ValueError(f"rank {k}: a window's log is at most {MAX_LOG_CHARS} characters")
        return v


LogProb = Annotated[float, Field(le=0, allow_inf_nan=False)]


class Answer(BaseModel):
    """One accuracy prompt's greedy answer (app/ab_prompts.py): its tokens as the server's text pieces, each one's
    logprob, and at each step the runner-up (the best other token of the server's top 2) with its logprob, so that
    a departure from A's answer can be told from a flip between near-tied tokens (app/domain/ab_gate.accuracy)."""

    model_config = ConfigDict(extra="forbid")

    tokens: list[Annotated[str, Field(max_length=1000)]] = Field(max_length=256)
    logprobs: list[LogProb | None] = Field(default_factory=list, max_length=256)
    runner_up: list[LogProb | None] = Field(default_factory=list, max_length=256)
    runner_up_tokens: list[Annotated[str, Field(max_length=1000)] | None] = Field(default_factory=list, max_length=256)


class ArmIn(BaseModel):
    """POST /v1/ab/runs/{id}/arms: an arm's server log from its start through warm-up (AITER logs a tuned hit once
    per shape per process, so it may come before any window) and its greedy answers to the accuracy prompts."""

    model_config = ConfigDict(extra="forbid")

    arm: Arm
    logs: dict[str, str] = Field(default_factory=dict, max_length=512)
    answers: list[Answer] | None = Field(default=None, max_length=256)

    _logs = field_validator("logs")(PassIn._logs.__func__)  # type: ignore[attr-defined]


class FaultIn(BaseModel):
    """POST /v1/ab/runs/{id}/interrupt: why the drive stopped (the run's void reason until it is resumed)."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=2000)
