"""Wire models. The worker (workers/) speaks these as plain JSON; it does not import this module."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
GFX_RE = re.compile(r"^(gfx[0-9a-f]{3,5}|cpu|sm_\d{2,3}|[a-z][a-z0-9_-]{1,31})$")


def check_digest(v: str) -> str:
    if not DIGEST_RE.match(v):
        raise ValueError("expected an image digest 'sha256:' followed by 64 lowercase hex digits")
    return v


class Identity(BaseModel):
    image_digest: str
    gfx: str = Field(min_length=2, max_length=32)
    cu_num: int = Field(ge=1, le=4096)

    _digest = field_validator("image_digest")(check_digest)

    @field_validator("gfx")
    @classmethod
    def _gfx(cls, v: str) -> str:
        if not GFX_RE.match(v):
            raise ValueError("expected a gfx arch such as gfx942 or gfx950")
        return v


class CaptureIn(Identity):
    family: str
    aiter_version: str | None = Field(None, max_length=80)
    aiter_commit: str | None = Field(None, max_length=80)
    host: str | None = Field(None, max_length=255)
    env: dict[str, str] = Field(default_factory=dict)  # GPU_ARCHS, CU_NUM, AITER_REBUILD, flydsl, ...
    shapes: list[dict[str, Any]] | None = None
    untuned_csv: str | None = None
    log: str | None = None
    # the sender's id for this capture; a repeat is acknowledged (duplicate) without counting twice
    capture_uid: str | None = Field(None, min_length=8, max_length=128, pattern=r"^[\w.:-]+$")
    # engine steps per tokens-per-step bucket since the sender's last capture, keyed by the bucket's upper
    # bound ("1", "8", ..., "+Inf"; not cumulative): vLLM's vllm:iteration_tokens_total. With it, `shapes` may
    # be empty (a metrics-only update).
    step_buckets: dict[str, int] | None = Field(None, max_length=64)


class CaptureOut(BaseModel):
    capture_id: int
    campaign_id: int
    family: str
    shapes_received: int
    shapes_new: int
    calls_added: int
    notes: list[str] = []
    duplicate: bool = False  # this capture_uid was already counted; nothing was added
    priority_rule: str = ""  # what orders the campaign's queue now (app/domain/served.py)


class LeaseIn(Identity):
    worker_id: str = Field(min_length=1, max_length=128, pattern=r"^[\w.:@-]+$")
    backends: list[str] = Field(min_length=1)
    families: list[str] | None = None  # families this worker's backend can tune (None: all)
    budget_s: float = Field(gt=0, le=24 * 3600)
    max_shapes: int | None = Field(None, ge=1, le=10_000)
    host: str | None = None
    aiter_commit: str | None = None


class LeasedShape(BaseModel):
    shape_id: int
    shape: dict[str, str]
    calls: int
    attempts: int


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


class Candidate(BaseModel):
    name: str
    us: float | None = None
    err_ratio: float | None = None
    error: str | None = None


class ResultIn(BaseModel):
    shape_id: int
    backend: str
    status: Literal["ok", "default_best", "failed"]  # default_best: tuned, nothing beat the default, no row
    row: dict[str, Any] | None = None  # the winner in the family's tuned schema
    us: float | None = None
    err_ratio: float | None = None
    kernel_name: str | None = None
    default_us: float | None = None
    candidates: list[Candidate] = Field(default_factory=list, max_length=10_000)
    error: str | None = Field(None, max_length=20_000)
    elapsed_s: float | None = Field(None, ge=0)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    aiter_commit: str | None = None


class ReleaseIn(BaseModel):
    started: list[int] = Field(default_factory=list, max_length=10_000)  # shapes being worked on: they count a try


class ResultOut(BaseModel):
    result_id: int
    shape_state: str
    verified: bool
    duplicate: bool = False


class ImageTablesIn(BaseModel):
    aiter_version: str | None = None
    aiter_commit: str | None = None
    configs_dir: str | None = Field(None, max_length=500)  # absolute path of aiter/configs/ in the image
    tables: dict[str, str]  # path under aiter/configs/ -> CSV text


class LogIn(Identity):
    family: str
    log: str


class VerificationIn(BaseModel):
    image_digest: str
    family: str
    worker_id: str = Field(min_length=1, max_length=128)
    aiter_commit: str | None = None
    rows: int = Field(ge=0)
    exit_code: int
    command: str = Field(max_length=4000)
    output_tail: str = Field(max_length=20_000)

    _digest = field_validator("image_digest")(check_digest)
