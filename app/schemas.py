"""Request and response models of the service's own routes. The service<->worker models live in app/wire.py
(re-exported here for the routes)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field, field_validator

from app.wire import (KERNEL_NAME_PATTERN, Candidate, HeartbeatOut, Identity, LeasedShape, LeaseIn, LeaseOut,
                      ReleaseIn, ReleaseOut, ResultIn, ResultOut, Wire, absolute_plain_path, check_digest, relative_plain_path)

__all__ = ["Candidate", "HeartbeatOut", "Identity", "LeasedShape", "LeaseIn", "LeaseOut", "ReleaseIn",
           "ReleaseOut", "ResultIn", "ResultOut", "check_digest"]

BIG_TEXT = 64 * 1024 * 1024  # CSV and log bodies: bounded by the request body limit (app/limits.py)
Scalar = str | int | float | bool | None

class CaptureIn(Identity):
    family: str
    aiter_version: str | None = Field(None, max_length=80)
    aiter_commit: str | None = Field(None, max_length=80)
    host: str | None = Field(None, max_length=255)
    env: dict[Annotated[str, Field(max_length=128)], Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict, max_length=256)  # GPU_ARCHS, CU_NUM, AITER_REBUILD, flydsl, ...
    shapes: list[dict[Annotated[str, Field(max_length=64)], Scalar]] | None = None
    untuned_csv: str | None = Field(None, max_length=BIG_TEXT)
    log: str | None = Field(None, max_length=BIG_TEXT)
    # the sender's id for this capture; a repeat is acknowledged (duplicate) without counting twice
    capture_uid: str | None = Field(None, min_length=8, max_length=128, pattern=r"^[\w.:-]+$")
    # engine steps per tokens-per-step bucket since the sender's last capture, keyed by the bucket's upper
    # bound ("1", "8", ..., "+Inf"; not cumulative): vLLM's vllm:iteration_tokens_total. With it, `shapes` may
    # be empty (a metrics-only update).
    step_buckets: dict[Annotated[str, Field(max_length=32)], Annotated[int, Field(ge=0, le=2**62)]] | None = Field(
        None, max_length=64)
    # finished requests per prompt / generation length bucket since the sender's last capture (upper bounds, not
    # cumulative): vLLM's vllm:request_prompt_tokens and vllm:request_generation_tokens. The serving A/B's default
    # input and output lengths come from them (app/domain/ab_gate.py default_points).
    length_buckets: dict[Literal["prompt", "generation"], dict[Annotated[str, Field(max_length=32)], Annotated[
        int, Field(ge=0, le=2**62)]]] | None = Field(None, max_length=2)


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


class ImageTablesIn(Wire):
    aiter_version: str | None = None
    aiter_commit: str | None = None
    # absolute path of aiter/configs/ in the image; it is echoed into the line operators paste, so no shell
    # metacharacters (quotes, $, `, ;, &, |, spaces...) and no '..'
    configs_dir: Annotated[str, AfterValidator(absolute_plain_path)] | None = Field(None, max_length=500)
    tables: dict[Annotated[str, Field(max_length=300), AfterValidator(relative_plain_path)],
                 Annotated[str, Field(max_length=BIG_TEXT)]] = Field(
        max_length=2000)  # path under aiter/configs/ -> CSV text
    flydsl: bool | None = None  # AITER's is_flydsl_available() in the image
    # the image's kernel catalog per family: every kernel name its tuner may race (and post as kernel_name);
    # an upgrade's triage re-races a carried row whose kernel the new image no longer has
    kernels: dict[Annotated[str, Field(max_length=64)],
                  list[Annotated[str, Field(min_length=1, max_length=512, pattern=KERNEL_NAME_PATTERN)]]] | None = Field(
        None, max_length=64)


class InheritIn(Wire):
    """POST /v1/images/{digest}/inherit: the image this one upgrades, whose tuning it carries over."""

    from_: Annotated[str, AfterValidator(check_digest)] = Field(alias="from")


class LogIn(Identity):
    family: str = Field(max_length=64)
    log: str = Field(max_length=BIG_TEXT)
    form: Literal["layer", "merged", "model_configs_dropin"] | None = None  # how it was deployed (default: plan's)
    ranks: int = Field(1, ge=1, le=512)  # the ranks the server runs (tensor parallel): each is expected to log


class VerificationIn(Wire):
    image_digest: str
    family: str
    worker_id: str = Field(min_length=1, max_length=128)
    aiter_commit: str | None = None
    rows: int = Field(ge=0)
    exit_code: int
    command: str = Field(max_length=4000)
    output_tail: str = Field(max_length=20_000)

    _digest = field_validator("image_digest")(check_digest)


class ProvedShape(Wire):
    shape_id: int
    hit: bool
    kernel: str | None = Field(None, max_length=500)
    raised: str | None = Field(None, max_length=2000)  # what AITER raised on this shape (a verdict: raises)
    # the row AITER's lookup returned (engagement.ROW_IDENTITY cells), used or not
    row: dict[Annotated[str, Field(max_length=32)], Annotated[str, Field(max_length=500)]] | None = Field(
        None, max_length=16)


class EngagementProofIn(Wire):
    """AITER's own lookup, run in the served image on one deploy form (aiter-tuner verify --engagement)."""
    form: Literal["layer", "merged", "model_configs_dropin"]
    worker_id: str = Field(max_length=128)
    aiter_commit: str | None = Field(None, max_length=80)
    aiter_version: str | None = Field(None, max_length=80)
    flydsl: bool | None = None
    error: str | None = Field(None, max_length=20_000)  # what AITER raised while resolving the table
    results: list[ProvedShape] = Field(default_factory=list, max_length=200_000)


class TokenIn(BaseModel):
    name: str = Field(min_length=1, max_length=120)
    role: Literal["capture", "worker", "admin", "read"]
    digests: list[Annotated[str, AfterValidator(check_digest)]] | None = Field(
        None, description="scope to these image digests (None: every image)")


class TokenOut(BaseModel):
    id: int
    name: str
    role: str
    digests: list[str] | None
    created_at: datetime
    revoked: bool
    token: str | None = None  # the secret: in the answer to create only, never stored or shown again
