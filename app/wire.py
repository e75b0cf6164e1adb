"""The service <-> worker wire format: lease, heartbeat, result and release, as pydantic models.

One module that both sides import: the service's routes declare these as bodies and response models, and the
worker (workers/client.py) validates what it sends and receives against them. It imports pydantic only, so a
worker needs neither FastAPI nor SQLAlchemy. The input rules every wire model shares live here too: no NaN or
Infinity, no NUL bytes or lone surrogates, bounded strings, ids and counts; a violation is a
422 naming the field (app/errors.py), never a 500 from the database.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, field_validator

INT64_MAX = 2**63 - 1
MAX_BUDGET_S = 24 * 3600  # one lease's budget at most
MAX_TEXT = 4096  # default bound on any string field without its own
# Checked with fullmatch only: re.match's `$` also matches before a trailing newline, and one digest with a
# newline in it broke every idle worker's 204 header (issue 26).
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
GFX_RE = re.compile(r"gfx[0-9a-f]{3,5}|cpu|sm_\d{2,3}|[a-z][a-z0-9_-]{1,31}")
# a pydantic `pattern` (pydantic-core's Rust regex, re.search semantics): anchored at both ends, where Rust's `$`
# is the end of the text only (no newline before it), as \z is
NAME_PATTERN = r"^[\w.:@-]+$"
# one kernel name: AITER's own are ASCII letters, digits and '_' (all 55,846 kernelName* cells of its shipped
# aiter/configs/*.csv, the longest 159), as are the torch backend's; no newline, space, full-width '=' or other
# text a spreadsheet or a log line could take for something else. A result's kernel_name is one, or fmoe's two
# stages joined by '+' (TableFamily.kernel_of).
KERNEL_NAME_PATTERN = r"^[A-Za-z0-9_]{1,512}$"
KERNEL_PATTERN = r"^[A-Za-z0-9_]{1,512}(\+[A-Za-z0-9_]{1,512})?$"
KERNEL_NAME_RE = re.compile(KERNEL_NAME_PATTERN[1:-1])
IDLE_HEADER = "X-Tuner-Idle-Reason"  # on a 204 to a lease request: why there is no work for this worker
# on that 204: shapes of this worker's identity (image, gfx, cu_num, families) leased to some worker now. Each can
# come back to the queue (its holder killed, its lease expiring), so a --once worker waits for them to end
IN_FLIGHT_HEADER = "X-Tuner-In-Flight"
_UNSAFE_IN_HEADER = re.compile(r"[^\x20-\x7e]")
# the worker id acting on a lease (heartbeat, results, release): it must be the worker the lease was granted
# to, so workers that share a token cannot act on each other's leases
WORKER_HEADER = "X-Tuner-Worker"


def header_value(text: str) -> str:
    """Text as an HTTP header value: printable ASCII only (a CR or LF would end the header and drop the
    connection; anything else non-ASCII is escaped), bounded."""
    return _UNSAFE_IN_HEADER.sub(lambda m: ascii(m.group())[1:-1], text)[:2000]


_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def formula_safe(v: str) -> str:
    """A cell a spreadsheet opening the overlay would not run as a formula (CSV injection: '=HYPERLINK(...)'):
    nothing starting with = + - @ tab or CR, but a number. AITER's own tables start none of their kernel names so,
    and only numbers with '-' (-1 in tuned_fmoe.csv's topk, cluster_n; its shipped aiter/configs/*.csv)."""
    if v[:1] in ("=", "+", "-", "@", "\t", "\r") and not _NUMBER.fullmatch(v):
        raise ValueError("starts like a spreadsheet formula (=, +, -, @, tab or CR) and is not a number")
    return v


def _check_text(s: str) -> None:
    if "\x00" in s:
        raise ValueError("contains a NUL byte")
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains a lone surrogate (not valid Unicode text)") from None


def check_clean(value: Any) -> Any:
    """Every string inside (keys too) is valid text; floats finite; ints within 64 bits."""
    if isinstance(value, str):
        _check_text(value)
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("must be a finite number (no NaN or Infinity)")
    elif isinstance(value, int) and not isinstance(value, bool):
        if not -INT64_MAX - 1 <= value <= INT64_MAX:
            raise ValueError("integer out of the 64-bit range")
    elif isinstance(value, dict):
        for k, v in value.items():
            check_clean(k)
            check_clean(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            check_clean(v)
    return value


def check_digest(v: str) -> str:
    if not DIGEST_RE.fullmatch(v):
        raise ValueError("expected an image digest 'sha256:' followed by 64 lowercase hex digits")
    return v


_PLAIN_PATH = re.compile(r"[A-Za-z0-9._+/-]+")


def relative_plain_path(v: str) -> str:
    """A path that is pasted into a shell line: letters, digits and ._+-/ only, no '..' (no quoting needed)."""
    if not _PLAIN_PATH.fullmatch(v) or ".." in v.split("/") or v.startswith("/"):
        raise ValueError("expected a relative path of letters, digits and . _ + - / (no '..', no shell characters)")
    return v


def absolute_plain_path(v: str) -> str:
    if not v.startswith("/") or not _PLAIN_PATH.fullmatch(v) or ".." in v.split("/"):
        raise ValueError("expected an absolute path of letters, digits and . _ + - / (no '..', no shell characters)")
    return v


Id = Annotated[int, Field(ge=1, le=INT64_MAX)]  # a database id: never past PostgreSQL's BIGINT
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=NAME_PATTERN)]
Seconds = Annotated[float, Field(ge=0, le=7 * 24 * 3600)]
Micros = Annotated[float, Field(gt=0, le=1e12)]  # a kernel time in microseconds


class Wire(BaseModel):
    """Base of every request model: finite floats, bounded clean strings."""

    model_config = ConfigDict(allow_inf_nan=False, str_max_length=MAX_TEXT)

    @field_validator("*", mode="after")
    @classmethod
    def _clean(cls, v: Any) -> Any:
        return check_clean(v)


class Identity(Wire):
    image_digest: Annotated[str, AfterValidator(check_digest)]
    gfx: str = Field(min_length=2, max_length=32)
    cu_num: int = Field(ge=1, le=4096)

    @field_validator("gfx")
    @classmethod
    def _gfx(cls, v: str) -> str:
        if not GFX_RE.fullmatch(v):
            raise ValueError("expected a gfx arch such as gfx942 or gfx950")
        return v


class LeaseIn(Identity):
    worker_id: Name
    backends: list[Annotated[str, Field(min_length=1, max_length=32, pattern=NAME_PATTERN)]] = Field(
        min_length=1, max_length=8)
    families: list[Annotated[str, Field(max_length=64)]] | None = Field(None, max_length=64)  # None: all
    budget_s: float = Field(gt=0, le=MAX_BUDGET_S)
    max_shapes: int | None = Field(None, ge=1, le=10_000)
    host: str | None = Field(None, max_length=255)
    aiter_commit: str | None = Field(None, max_length=80)


class LeasedShape(BaseModel):
    shape_id: int
    shape: dict[str, str]
    calls: int
    attempts: int  # this try's number (1 on the first lease)
    # a confirmation race (an image upgrade carried this shape's row from the image it inherits from,
    # app/domain/upgrade.py): the kernel to confirm (the carried row's, or the new image's shipped one), and the
    # kernels to race beside the default: the incumbent first, then the parent race's best. Empty: a full race.
    incumbent: str | None = None
    finalists: list[str] = []


class LeaseOut(BaseModel):
    lease_id: str
    campaign_id: int
    family: str
    image_digest: str
    gfx: str
    cu_num: int
    backend: str
    budget_s: float
    expires_at: datetime
    hard_deadline: datetime
    heartbeat_every_s: float
    est_shape_cost_s: float
    tuned_header: list[str]  # the image's own header for rows posted back
    untuned_header: list[str]  # the image's own header for its tuner's input
    shapes: list[LeasedShape]


class HeartbeatOut(BaseModel):
    lease_id: str
    expires_at: datetime
    hard_deadline: datetime


class Candidate(Wire):
    name: str = Field(max_length=512, pattern=KERNEL_NAME_PATTERN)
    us: float | None = Field(None, ge=0)
    err_ratio: float | None = Field(None, ge=0)
    error: str | None = Field(None, max_length=4000)
    # the final round's worst and p90 sample, drift (last capture window's median / the first's - 1), spread
    # (slowest capture window's median / the fastest's - 1) and each window's median (issue 34)
    worst_us: float | None = Field(None, ge=0)
    p90_us: float | None = Field(None, ge=0)
    drift: float | None = Field(None, ge=-1, le=1e6)
    spread: float | None = Field(None, ge=0, le=1e6)
    captures: list[Annotated[float, Field(ge=0)]] = Field(default_factory=list, max_length=64)


class Timing(Wire):
    """How far a result's timing can be believed (issue 34): the decision over the capture windows and why."""

    decision: Literal["win", "tie", "lead", "samples"] | None = None  # samples: no capture windows to decide on
    reason: str | None = Field(None, max_length=1000)
    windows: int = Field(0, ge=0, le=1000)  # capture windows timed
    busy_windows: int = Field(0, ge=0, le=1000)  # windows thrown away and timed again (the GPU was busy)
    worst_us: float | None = Field(None, ge=0)
    p90_us: float | None = Field(None, ge=0)
    drift: float | None = Field(None, ge=-1, le=1e6)
    spread: float | None = Field(None, ge=0, le=1e6)


class ResultStatus(StrEnum):
    """What a worker says of one shape's race: the wire's `status`, the backends' ShapeResult.status and the
    results table's column are its values (a StrEnum: equal to, and serialised as, the plain string)."""

    OK = "ok"  # a winner row that beats the default
    DEFAULT_BEST = "default_best"  # tuned, nothing beat the default: no row
    FAILED = "failed"  # the backend could not tune the shape


class ResultIn(Wire):
    shape_id: Id
    backend: str = Field(min_length=1, max_length=32, pattern=NAME_PATTERN)
    status: ResultStatus
    row: dict[Annotated[str, Field(max_length=64)], str | int | float | bool | None] | None = Field(
        None, max_length=64)  # the winner in the family's tuned schema
    us: Micros | None = None
    err_ratio: float | None = Field(None, ge=0, le=1)
    kernel_name: str | None = Field(None, max_length=1025, pattern=KERNEL_PATTERN)
    default_us: Micros | None = None
    candidates: list[Candidate] = Field(default_factory=list, max_length=10_000)
    error: str | None = Field(None, max_length=20_000)
    elapsed_s: Seconds | None = None
    started_at: AwareDatetime | None = None  # with its timezone: a naive time is no instant
    finished_at: AwareDatetime | None = None
    aiter_commit: str | None = Field(None, max_length=80)
    # the decision's sign-test confidence over the capture windows, the winner's capture-to-capture spread
    confidence: float | None = Field(None, ge=0, le=1)
    spread: float | None = Field(None, ge=0, le=1e6)
    timing: Timing | None = None


class ResultOut(BaseModel):
    result_id: int
    shape_state: str
    verified: bool
    duplicate: bool = False


MAX_RESULTS = 64  # results in one batch post


class ResultsIn(Wire):
    """Results of one lease in one request: what a worker finished since its last post (at most one post a
    second, workers/agent.py), each taken as its own POST .../results would take it."""

    results: list[ResultIn] = Field(min_length=1, max_length=MAX_RESULTS)


class ResultOutcome(BaseModel):
    """One result's answer in a batch: the ResultOut its own post would give, or that post's problem."""

    shape_id: int
    status: int  # the HTTP status its own post would have answered
    result: ResultOut | None = None
    field: str | None = None
    detail: str | None = None


class ResultsOut(BaseModel):
    outcomes: list[ResultOutcome]  # in the order posted


class ReleaseIn(Wire):
    started: list[Id] = Field(default_factory=list, max_length=10_000)  # shapes being worked on: they count a try
    reason: str | None = Field(None, max_length=500)  # why the worker hands it back early (the GPU was busy)


class ReleaseOut(BaseModel):
    lease_id: str
    requeued: int


class BuildIn(Wire):
    """The compile lane's report: seconds a worker spent warming AITER's JIT build for an image and family,
    before its first batch and outside any lease (its own budget)."""

    image_digest: Annotated[str, AfterValidator(check_digest)]
    family: str = Field(min_length=1, max_length=64)
    worker_id: Name
    seconds: Seconds
    ok: bool
    aiter_commit: str | None = Field(None, max_length=80)
    output_tail: str = Field("", max_length=20_000)


class BuildOut(BaseModel):
    id: int
    image_digest: str
    family: str
    worker_id: str
    seconds: float
    ok: bool
    created_at: datetime
