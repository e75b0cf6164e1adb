"""Settings from the environment (prefix TUNER_; DATABASE_URL also read bare)."""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TUNER_")

    database_url: str = Field("sqlite:///./data/tuner.db",
                              validation_alias=AliasChoices("DATABASE_URL", "TUNER_DATABASE_URL"))
    host: str = "127.0.0.1"  # where `aiter-tuner serve` listens
    port: int = 8000
    max_body_bytes: int = 8 * 1024 * 1024
    lease_ttl_s: float = 60.0  # a lease dies this long after its last heartbeat
    lease_grace_s: float = 30.0  # past budget: no heartbeat extends a lease beyond budget + grace
    max_capture_shapes: int = 20_000  # distinct shapes in one capture (a bigger one is refused: split it)
    max_campaign_shapes: int = 200_000  # shapes one campaign may hold (a queue past this is not a tuning plan)
    max_attempts: int = 3  # a shape failing this many times is parked as failed
    min_improvement_pct: float = 3.0  # a row reaches the overlay only past this gain over the default (AITER's)
    default_shape_cost_s: float = 30.0  # until a campaign has measured costs
    max_lease_shapes: int = 256  # shapes in one lease at most, whatever the measured cost says
    sqlite_busy_ms: int = 5000
    # PostgreSQL: at most this many lease transactions at once: a lease, heartbeat or release on the event
    # loop's connections (Database.aplain), a result on threads of its own (0: 40 and the shared thread pool).
    # Fewer threads contending for the GIL: 64 agents' lease p99 below the 40-thread pool's in 6 of 7
    # alternating rounds (benchmarks/RESULTS.md). SQLite's writers wait for the write lock inside their
    # thread, so there the lease routes keep the shared pool.
    lease_threads: int = 4
    retry_after_s: int = 1
    stale_worker_s: float = 120.0
    # /healthz answers 503 this long after a write failed for want of disk (or a read-only database) unless a write
    # commits a change meanwhile; then it probes with a write of its own
    health_write_hold_s: float = 30.0
    auth: bool = True  # bearer tokens with roles; off only for local experiments
    token_cache_s: float = 5.0  # a resolved token is trusted this long: a revocation takes up to this to bite
    read_open: bool = True  # overlays, reports and the dashboard need no token
    cookie_secure: bool = False  # the sign-in cookie only over HTTPS (set it where the service is served on TLS)
    admin_token: str | None = None  # TUNER_ADMIN_TOKEN: the first admin token, instead of a generated one
    admin_token_file: str = "./data/admin_token"  # where a generated first admin token is written (0600)
