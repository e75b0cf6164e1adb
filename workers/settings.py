"""The worker's settings, one object: flags over the environment (TUNER_<NAME>, and AITER's own AITER_ROOT,
AITER_COMMIT, AITER_PACKAGE_DIR) over defaults, validated by pydantic. The pool manager writes the same names
into each container's environment (env()).

A plain pydantic model, not pydantic-settings: the worker runs from a read-only mount inside the served image
(workers/pool.py), where pydantic is there (vLLM and SGLang need it) and pydantic-settings need not be."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.wire import DIGEST_RE

_AITER_ENV = {"aiter_root": "AITER_ROOT", "aiter_commit": "AITER_COMMIT", "aiter_package": "AITER_PACKAGE_DIR"}


class WorkerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    service_url: str = "http://127.0.0.1:8000"
    gpu: int = Field(0, ge=0, description="GPU index (within HIP_VISIBLE_DEVICES); ignored without a GPU")
    budget_s: float = Field(300.0, gt=0, description="time budget of one leased batch")
    compile_budget_s: float = Field(1800.0, ge=0, description="the compile lane's own budget: warming AITER's JIT "
                                    "build per family, outside every lease (0: no lane)")
    race: Literal["halving", "exhaustive"] = Field("halving", description="halving (torch: successive halving; "
                                                   "aiter: screen, then confirm) or exhaustive (one full run)")
    min_improvement_pct: float = Field(3.0, description="a row only past this gain over the default path "
                                       "(AITER's --min_improvement_pct)")
    backend: Literal["aiter", "torch"] = "aiter"
    image_digest: str | None = Field(None, description="digest of the image this container runs")
    worker_id: str | None = Field(None, description="default: <host>-<device>, e.g. node3-cuda0 or vm1-cpu")
    token: str | None = None
    token_file: str | None = Field(None, description="a file holding the worker token (read when no --token is "
                                   "given), so the token is never on a command line or in a container's config")
    aiter_root: str | None = Field(None, description="AITER's source tree (default: found from the aiter package)")
    aiter_commit: str | None = None
    aiter_package: str | None = Field(None, description="the installed aiter package dir (default: by import)")
    once: bool = False
    max_batches: int | None = None
    max_shapes: int | None = None
    repeats: int = 15
    candidate_limit_s: float = 10.0
    mem_cap_gib: float | None = Field(None, gt=0, description="the most GPU memory the torch race may hold, GiB "
                                      "(default: what the card has free; set it where a server shares the card)")
    poll_s: float = 5.0
    outage_log_s: float = Field(30.0, gt=0, description="while the service is unreachable, say so this often")
    spool_dir: str | None = Field(None, description="finished results wait here until the service takes them "
                                                    "(default: per worker, under ~)")

    @field_validator("service_url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")) or not v.split("://", 1)[1].strip("/"):
            raise ValueError(f"the service URL must start with http:// or https:// and name a host, got {v!r}")
        return v

    @field_validator("image_digest")
    @classmethod
    def _digest(cls, v: str | None) -> str | None:
        if v is not None and not DIGEST_RE.fullmatch(v):
            raise ValueError(f"expected sha256:<64 lowercase hex digits> (the image's digest), got {v!r}")
        return v

    def resolved_token(self) -> str | None:
        """--token, else the first line of --token-file; a token file that is unreadable or empty is an error
        (OSError/ValueError naming the file), never a worker silently without a token."""
        if self.token or not self.token_file:
            return self.token
        try:
            text = open(self.token_file, encoding="utf-8").read().strip()
        except OSError as e:
            raise OSError(f"cannot read the token file {self.token_file!r}: {e.strerror or e}") from None
        if not text:
            raise ValueError(f"the token file {self.token_file!r} is empty")
        return text.splitlines()[0].strip()

    @staticmethod
    def env_name(field: str) -> str:
        return _AITER_ENV.get(field, f"TUNER_{field.upper()}")

    @classmethod
    def load(cls, flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] = os.environ
             ) -> WorkerSettings:
        """Flags given on the command line (None: not given) override the environment."""
        values: dict[str, Any] = {f: environ[cls.env_name(f)] for f in cls.model_fields
                                  if environ.get(cls.env_name(f))}
        values.update({k: v for k, v in (flags or {}).items() if v is not None})
        return cls(**values)

    def env(self, *fields: str) -> dict[str, str]:
        """These settings as the environment a worker container reads them from."""
        return {self.env_name(f): str(getattr(self, f)) for f in fields}
