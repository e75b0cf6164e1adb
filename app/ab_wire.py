"""The serving A/B's wire format (issue 32): the operating points a run measures and the per-request records its
driver posts. One module the service, the driver (beside the servers) and the load generator all import; pydantic
only, like app/wire.py, so the driver runs in a serving image without the service's dependencies."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The arms of every run: A is the baseline (shipped tables only, or the promoted overlay), A_prime the identical-arm
# control (A's files exactly: an effect between A and A_prime is noise, and voids the run), B the version under test.
Arm = Literal["A", "A_prime", "B"]
ARMS: tuple[Arm, ...] = ("A", "A_prime", "B")
BAND_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class OperatingPoint(BaseModel):
    """One band: a concurrency level at one input/output length."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    concurrency: int = Field(ge=1, le=4096)
    input_len: int = Field(ge=1, le=1_000_000)
    output_len: int = Field(ge=1, le=1_000_000)

    @property
    def name(self) -> str:
        return f"c{self.concurrency}-i{self.input_len}-o{self.output_len}"


class RequestRecord(BaseModel):
    """One request as the load generator saw it. Times are seconds; `started_s` counts from the start of the run
    (the driver's monotonic clock), so the drift between passes can be seen and modelled."""

    model_config = ConfigDict(extra="forbid")

    arm: Arm
    band: str = Field(max_length=64)
    repeat: int = Field(ge=0, le=10_000)  # the pass (ABBA... position) this request ran in
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
