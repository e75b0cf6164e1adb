"""What a backend gives the agent: run a leased batch, emitting each shape's result as it finishes."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol, runtime_checkable

from app.domain.improvement import MIN_IMPROVEMENT_PCT, row_helps  # noqa: F401  (the backends' rule)
from app.wire import ResultStatus


@dataclass
class ShapeResult:
    shape_id: int
    status: ResultStatus  # ok (a row that helps) | default_best (tuned, no row) | failed
    row: dict[str, Any] | None = None
    us: float | None = None
    err_ratio: float | None = None
    kernel_name: str | None = None
    default_us: float | None = None
    candidates: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    elapsed_s: float | None = None
    started_at: str | None = None
    finished_at: str | None = None
    race: dict[str, Any] | None = None  # what the race cost (samples, sampled seconds); local, not posted
    # how far the timing can be believed (issue 34): the decision's confidence over capture windows, the
    # winner's capture-to-capture spread, and the decision, its reason, worst/p90/drift of the winner
    confidence: float | None = None
    spread: float | None = None
    timing: dict[str, Any] | None = None

    def payload(self, backend: str, aiter_commit: str | None) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "race"}
        d.update(backend=backend, aiter_commit=aiter_commit)
        # a losing candidate that never finished has no finite time or error: say so with null, not NaN/inf
        d["candidates"] = [{k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in c.items()}
                           for c in self.candidates]
        return d


class GpuBusy(RuntimeError):
    """The device was not idle (another process on it, or the race's control kernel drifted) and re-timing did
    not help: the agent hands the lease back with this reason and books nothing (issue 34)."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


@dataclass
class Batch:
    lease: dict[str, Any]
    deadline: float  # time.monotonic() by which every shape must be done
    should_stop: Callable[[], bool]

    def time_left(self) -> float:
        return self.deadline - time.monotonic()


Emit = Callable[[ShapeResult], None]


class Backend(Protocol):
    name: str
    families: list[str]

    def run(self, batch: Batch, emit: Emit) -> None: ...


# What a backend may offer beyond run(): the agent and the CLI ask with isinstance, never by attribute name.

@runtime_checkable
class Warms(Protocol):
    """A backend with a compile lane (workers/agent.py): builds what its races need, outside every lease."""

    def warm(self, lease: dict[str, Any], budget_s: float, should_stop: Callable[[], bool]) -> dict[str, Any]:
        """Build for the lease's family under budget_s; the wire's build report fields (seconds, ok,
        output_tail: app/wire.py BuildIn)."""
        ...


@runtime_checkable
class MayBuild(Protocol):
    """A warming backend that knows whether it has anything to build here (torch: only on a GPU with Triton);
    one without this builds every time it warms."""

    @property
    def builds(self) -> bool: ...


@runtime_checkable
class KernelCatalog(Protocol):
    """A backend that can say which kernels it may race, per family (PUT /v1/images/{digest}/tables)."""

    def kernel_catalog(self) -> dict[str, list[str]]: ...


def has_builds(backend: object) -> bool:
    """Whether the compile lane has anything to do for this backend: it warms, and has something to build."""
    return isinstance(backend, Warms) and (not isinstance(backend, MayBuild) or backend.builds)
