"""ORM rows. One campaign per (image digest, gfx, cu_num, family); shapes carry their queue state."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, MetaData, String,
                        Text, UniqueConstraint)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on both engines (SQLite stores naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime")
        return value.astimezone(timezone.utc) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value


class Base(DeclarativeBase):
    # stable constraint names so Alembic batch mode (SQLite) can alter them
    metadata = MetaData(naming_convention={
        "ix": "ix_%(column_0_label)s", "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s", "fk": "fk_%(table_name)s_%(column_0_name)s",
        "pk": "pk_%(table_name)s"})


class Image(Base):
    __tablename__ = "images"
    digest: Mapped[str] = mapped_column(String(80), primary_key=True)
    aiter_version: Mapped[str | None] = mapped_column(String(80))
    aiter_commit: Mapped[str | None] = mapped_column(String(80))
    configs_dir: Mapped[str | None] = mapped_column(String(500))  # the image's aiter/configs/, absolute
    # AITER's is_flydsl_available() in the image, as its worker found it (None: not reported)
    flydsl: Mapped[bool | None] = mapped_column(Boolean)
    # the image this one inherited its campaigns from (POST /v1/images/{digest}/inherit): an upgrade
    parent_digest: Mapped[str | None] = mapped_column(ForeignKey("images.digest"))
    # {family: [kernel names]}: what the image's tuner may race, as its worker reported it (None: not reported)
    kernel_catalog: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ImageTable(Base):
    """A table the image ships (its aiter/configs/ file), as the worker read it: header and text."""

    __tablename__ = "image_tables"
    __table_args__ = (UniqueConstraint("image_digest", "path"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    image_digest: Mapped[str] = mapped_column(ForeignKey("images.digest"), index=True)
    family: Mapped[str] = mapped_column(String(64), index=True)
    path: Mapped[str] = mapped_column(String(300))  # relative to aiter/configs/
    kind: Mapped[str] = mapped_column(String(16))  # default | model_config | untuned
    header: Mapped[str] = mapped_column(Text)
    content: Mapped[str] = mapped_column(Text)
    # sha256 of content: what the overlay cache keys the shipped tables on without reading them
    # (app/services/overlays.py); content is replaced in place when a worker reports the table again
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Campaign(Base):
    __tablename__ = "campaigns"
    __table_args__ = (UniqueConstraint("image_digest", "gfx", "cu_num", "family"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    image_digest: Mapped[str] = mapped_column(ForeignKey("images.digest"), index=True)
    gfx: Mapped[str] = mapped_column(String(32))
    cu_num: Mapped[int] = mapped_column(Integer)
    family: Mapped[str] = mapped_column(String(64))
    # steps per tokens-per-step bucket ({"1": n, "8": n, ..., "+Inf": n}) summed over the captures that sent
    # them; when present, shapes are weighted by served steps instead of calls (app/domain/served.py)
    step_hist: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # finished requests per length bucket, {"prompt": {"128": n, ...}, "generation": {...}}, summed the same way:
    # the serving A/B's default input and output lengths (app/domain/ab_gate.py default_lengths)
    length_hist: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    shapes: Mapped[list[CampaignShape]] = relationship(back_populates="campaign", lazy="raise")


class Capture(Base):
    __tablename__ = "captures"
    # a capture_uid is the sender's, unique within its image only: a token scoped to another image never meets it
    __table_args__ = (UniqueConstraint("image_digest", "capture_uid"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    image_digest: Mapped[str] = mapped_column(ForeignKey("images.digest"))
    # the sender's id for this capture: a repeat is acknowledged without counting twice
    capture_uid: Mapped[str | None] = mapped_column(String(128))
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id"), index=True)
    host: Mapped[str | None] = mapped_column(String(255))
    source_format: Mapped[str] = mapped_column(String(16))
    aiter_version: Mapped[str | None] = mapped_column(String(80))
    aiter_commit: Mapped[str | None] = mapped_column(String(80))
    env: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    shapes: Mapped[int] = mapped_column(Integer)
    calls: Mapped[int] = mapped_column(BigInteger)  # a hot decode shape passes 2^31 calls
    step_hist: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # the step-count deltas it carried
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class CampaignShape(Base):
    __tablename__ = "shapes"
    # (campaign_id, shape_key) also serves every campaign_id look-up; ix_shapes_queue (below) the rest
    __table_args__ = (UniqueConstraint("campaign_id", "shape_key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id"))
    shape_key: Mapped[str] = mapped_column(String(1000))
    shape: Mapped[dict[str, Any]] = mapped_column(JSON)
    calls: Mapped[int] = mapped_column(BigInteger, default=0)
    flops: Mapped[float] = mapped_column(Float)
    # the default path's time per call: the gfx's roofline estimate until a result measures it
    default_us: Mapped[float] = mapped_column(Float)
    default_measured: Mapped[bool] = mapped_column(Boolean, default=False)
    steps: Mapped[float | None] = mapped_column(Float)  # served steps, when the campaign has a step histogram
    # served time: (steps, else calls) x default_us (app/domain/served.py)
    priority: Mapped[float] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(16), default="queued")
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # counted tries, ever (app/domain/lease_states.py)
    attempts_base: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # attempts at last requeue
    lease_id: Mapped[str | None] = mapped_column(ForeignKey("leases.id"), index=True)
    last_error: Mapped[str | None] = mapped_column(Text)
    # inherited from the parent image's campaign (app/domain/upgrade.py): the triage verdict (None: captured
    # here), the parent's verified result it carried (served provisionally until confirmed), the parent race's
    # top kernels (raced beside the default and the incumbent), and how the confirmation ended
    triage: Mapped[str | None] = mapped_column(String(16))
    carried_result_id: Mapped[int | None] = mapped_column(Integer)  # results.id (no FK: results point at shapes)
    finalists: Mapped[list[str] | None] = mapped_column(JSON)
    outcome: Mapped[str | None] = mapped_column(String(16))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    campaign: Mapped[Campaign] = relationship(back_populates="shapes", lazy="raise")


# The queue in the order a lease takes it (priority DESC, id): a campaign's top shape, and the next n, are one
# index seek whatever the queue's size; counts by state per campaign read the index alone.
Index("ix_shapes_queue", CampaignShape.campaign_id, CampaignShape.state, CampaignShape.priority.desc(),
      CampaignShape.id)


class Worker(Base):
    __tablename__ = "workers"
    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    image_digest: Mapped[str] = mapped_column(String(80))
    gfx: Mapped[str] = mapped_column(String(32))
    cu_num: Mapped[int] = mapped_column(Integer)
    host: Mapped[str | None] = mapped_column(String(255))
    backends: Mapped[list[str]] = mapped_column(JSON, default=list)
    aiter_commit: Mapped[str | None] = mapped_column(String(80))
    first_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    token_id: Mapped[int | None] = mapped_column(Integer)  # the worker token that registered this id: only it acts as it


class Lease(Base):
    __tablename__ = "leases"
    # the sweeper's question (active and past expiry) is one seek, however many ended leases pile up
    __table_args__ = (Index("ix_leases_live", "state", "expires_at"),)
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    worker_id: Mapped[str] = mapped_column(ForeignKey("workers.id"), index=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id"), index=True)
    backend: Mapped[str] = mapped_column(String(32))
    budget_s: Mapped[float] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(16), default="active")  # active|released|expired|done
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    hard_deadline: Mapped[datetime] = mapped_column(UTCDateTime)  # created + budget + grace: no extension past it
    token_id: Mapped[int | None] = mapped_column(ForeignKey("tokens.id"))  # only this token may post to it
    end_reason: Mapped[str | None] = mapped_column(String(500))  # why its worker handed it back (GPU busy), if said


class Result(Base):
    __tablename__ = "results"
    __table_args__ = (UniqueConstraint("lease_id", "shape_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    shape_id: Mapped[int] = mapped_column(ForeignKey("shapes.id"), index=True)
    lease_id: Mapped[str] = mapped_column(ForeignKey("leases.id"), index=True)
    worker_id: Mapped[str] = mapped_column(String(128))
    backend: Mapped[str] = mapped_column(String(32))
    image_digest: Mapped[str] = mapped_column(String(80), index=True)
    aiter_commit: Mapped[str | None] = mapped_column(String(80))
    status: Mapped[str] = mapped_column(String(16))  # ok | failed
    us: Mapped[float | None] = mapped_column(Float)
    err_ratio: Mapped[float | None] = mapped_column(Float)
    verified: Mapped[bool] = mapped_column(Boolean, default=False)
    kernel_name: Mapped[str | None] = mapped_column(Text)
    default_us: Mapped[float | None] = mapped_column(Float)  # the untuned default, where the backend timed it
    row: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # the winner in the family's tuned schema
    candidates: Mapped[list[Any]] = mapped_column(JSON, default=list)
    error: Mapped[str | None] = mapped_column(Text)
    # issue 34: the decision's confidence over capture windows, the winner's spread, the decision and its reason
    confidence: Mapped[float | None] = mapped_column(Float)
    spread: Mapped[float | None] = mapped_column(Float)
    timing: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    elapsed_s: Mapped[float | None] = mapped_column(Float)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Token(Base):
    """An API token, stored as its SHA-256 (tokens are 256-bit random, so a fast hash is enough)."""

    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))  # capture | worker | admin | read
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    digests: Mapped[list[str] | None] = mapped_column(JSON)  # image digests it may act on; None: all
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Build(Base):
    """A worker's compile lane: AITER's JIT build warmed for an image and family, outside any lease."""

    __tablename__ = "builds"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    image_digest: Mapped[str] = mapped_column(ForeignKey("images.digest"), index=True)
    family: Mapped[str] = mapped_column(String(64))
    worker_id: Mapped[str] = mapped_column(String(128))
    seconds: Mapped[float] = mapped_column(Float)
    ok: Mapped[bool] = mapped_column(Boolean)
    aiter_commit: Mapped[str | None] = mapped_column(String(80))
    output_tail: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Verification(Base):
    """AITER's own replay of an overlay through the production op in the image (a tuner's --run_config)."""

    __tablename__ = "verifications"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    image_digest: Mapped[str] = mapped_column(ForeignKey("images.digest"), index=True)
    family: Mapped[str] = mapped_column(String(64))
    worker_id: Mapped[str] = mapped_column(String(128))
    aiter_commit: Mapped[str | None] = mapped_column(String(80))
    rows: Mapped[int] = mapped_column(Integer)
    exit_code: Mapped[int] = mapped_column(Integer)
    passed: Mapped[bool] = mapped_column(Boolean)
    command: Mapped[str] = mapped_column(Text)
    output_tail: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class EngagementProof(Base):
    """AITER's own lookup run inside the served image on a deploy form (workers.verify --engagement): which
    captured shapes it found a tuned row for, beside the service's prediction."""

    __tablename__ = "engagement_proofs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id"), index=True)
    form: Mapped[str] = mapped_column(String(32))
    worker_id: Mapped[str] = mapped_column(String(128))
    aiter_commit: Mapped[str | None] = mapped_column(String(80))
    aiter_version: Mapped[str | None] = mapped_column(String(80))
    flydsl: Mapped[bool | None] = mapped_column(Boolean)
    error: Mapped[str | None] = mapped_column(Text)  # what AITER raised while resolving the table
    results: Mapped[list[Any]] = mapped_column(JSON, default=list)  # [{shape_id, hit, kernel}]
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class DeployCheck(Base):
    """A server log taken after deploy (POST /v1/engagement/logs) read per rank: AITER's hit and miss lines, the
    shapes the overlay serves that the rank missed, its JIT builds while serving; and the alerts the campaign page
    shows (issue 49)."""

    __tablename__ = "deploy_checks"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id"), index=True)
    form: Mapped[str | None] = mapped_column(String(32))
    hit_lines: Mapped[int] = mapped_column(Integer)
    miss_lines: Mapped[int] = mapped_column(Integer)
    ranks: Mapped[list[Any]] = mapped_column(JSON)  # [{rank, hit_lines, miss_lines, missed_served, jit}]
    alerts: Mapped[list[Any]] = mapped_column(JSON)  # what the page says in red, one line each
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class OverlayVersion(Base):
    """An overlay as deployed and A/B'd (issue 32): the files of one deploy form, each with its sha256, frozen
    when made (later results make a new version, never change this one)."""

    __tablename__ = "overlay_versions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    image_digest: Mapped[str] = mapped_column(ForeignKey("images.digest"), index=True)
    form: Mapped[str] = mapped_column(String(32))  # app/domain/deploy.py FORMS
    state: Mapped[str] = mapped_column(String(16), default="candidate")  # app/domain/ab_states.py VersionState
    # [{family, env_var, name, sha256, rows, content, own}]: own = the overlay's own rows (what a rollback drops
    # rows from; for a merged file the deployed content also holds the shipped rows)
    files: Mapped[list[Any]] = mapped_column(JSON)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("overlay_versions.id"))  # a rollback's source
    note: Mapped[str] = mapped_column(Text, default="")
    withdrawn: Mapped[list[Any] | None] = mapped_column(JSON)  # [{family, row}] a rollback left out
    promoted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    promoted_run_id: Mapped[int | None] = mapped_column(Integer)  # ab_runs.id whose A/B promoted it
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class AbRun(Base):
    """A serving A/B of a version against a baseline (shipped tables only, or a promoted version)."""

    __tablename__ = "ab_runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    image_digest: Mapped[str] = mapped_column(ForeignKey("images.digest"), index=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("overlay_versions.id"), index=True)
    baseline_version_id: Mapped[int | None] = mapped_column(ForeignKey("overlay_versions.id"))  # None: shipped
    state: Mapped[str] = mapped_column(String(16), default="created")  # app/domain/ab_states.py RunState
    points: Mapped[list[Any]] = mapped_column(JSON)  # [OperatingPoint]
    points_source: Mapped[str] = mapped_column(String(32))  # captured (steps and lengths) | captured steps | captured lengths | default | given
    repeats: Mapped[int] = mapped_column(Integer)  # rounds per band (each round: every arm once)
    requests_per_pass: Mapped[int] = mapped_column(Integer)
    confidence: Mapped[float] = mapped_column(Float)
    power: Mapped[float] = mapped_column(Float)
    min_requests: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(Integer)
    max_loss: Mapped[float] = mapped_column(Float)  # promotion: every band's interval rules out a bigger loss
    # sequential rounds (app/domain/ab_stats.py `undecided`): an undecided band is measured on up to max_repeats
    # rounds (None: repeats, a fixed design), until its MDE is at most target_mde; band_rounds: each band's rounds
    # planned so far (None: repeats for every band)
    max_repeats: Mapped[int | None] = mapped_column(Integer)
    target_mde: Mapped[float | None] = mapped_column(Float)
    min_effect: Mapped[float | None] = mapped_column(Float)  # RunIn.min_effect (None: a run from before, 0)
    # the order the driver starts the arms' servers in, drawn at creation (ab_stats.START_ORDERS); None: a run from
    # before, started A, A', B and measured in A B A' / A' B A rounds
    start_order: Mapped[list[Any] | None] = mapped_column(JSON)
    band_rounds: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    fault: Mapped[str | None] = mapped_column(Text)  # why the drive stopped (state interrupted)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # verdicts, per band, control, engagement, accuracy
    rollback_version_id: Mapped[int | None] = mapped_column(Integer)  # proposed when a band regresses
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class AbPass(Base):
    """One arm's measured window of one band in one round: its requests and every rank's server log lines of the
    window, stored together or not at all."""

    __tablename__ = "ab_passes"
    __table_args__ = (UniqueConstraint("run_id", "band", "repeat", "arm"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("ab_runs.id"))
    band: Mapped[str] = mapped_column(String(64))
    repeat: Mapped[int] = mapped_column(Integer)
    arm: Mapped[str] = mapped_column(String(16))
    records: Mapped[list[Any]] = mapped_column(JSON)  # [RequestRecord]
    logs: Mapped[dict[str, Any]] = mapped_column(JSON)  # rank -> the window's log text
    probe: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # app/ab_wire.py NodeProbe: the host during the pass
    load: Mapped[str | None] = mapped_column(String(300))  # ab_wire.PassIn.load (None: a pass from before, own)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class AbArm(Base):
    """What an arm's server logged from its start through warm-up, and its greedy answers (accuracy)."""

    __tablename__ = "ab_arms"
    __table_args__ = (UniqueConstraint("run_id", "arm"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("ab_runs.id"))
    arm: Mapped[str] = mapped_column(String(16))
    logs: Mapped[dict[str, Any]] = mapped_column(JSON)  # rank -> start and warm-up log text
    first_tokens: Mapped[list[Any] | None] = mapped_column(JSON)  # runs before answers: greedy tokens only
    answers: Mapped[list[Any] | None] = mapped_column(JSON)  # ab_wire.Answer per accuracy prompt
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
