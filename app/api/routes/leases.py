"""Worker leasing: lease a turn-sized batch, heartbeat, post each result (or several at once), release."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, NamedTuple, TypeVar

import anyio.to_thread

from fastapi import APIRouter, Depends, Header, Request, Response
from pydantic import BaseModel

from app.api.deps import LeaseId
from app.auth import Principal, authorize
from app.config import Settings
from app.db.dialect import Rows, Steps
from app.db.session import Database
from app.errors import DomainError, Invalid
from app.wire import (IDLE_HEADER, IN_FLIGHT_HEADER, NAME_PATTERN, WORKER_HEADER, HeartbeatOut, LeaseIn, LeaseOut, ReleaseIn,
                      ReleaseOut, ResultIn, ResultOut, ResultOutcome, ResultsIn, ResultsOut, header_value)
from app.metrics import BACKENDS, bounded
from app.services import idle, leasing

router = APIRouter(tags=["leases"])
WORKER = ("worker",)
T = TypeVar("T")


class Fleet(NamedTuple):
    """What a lease route needs, resolved as one dependency: FastAPI's work per dependency it solves was a third
    of a lease's server CPU beyond the raw baseline's (the database, the settings, the token, the worker acting:
    six dependencies), and these are the fleet's most frequent requests."""
    db: Database
    settings: Settings
    who: Principal
    caller: leasing.Caller = leasing.ANYONE
    limiter: anyio.CapacityLimiter | None = None  # the lease routes' own threads (None: the shared pool)

    async def run(self, work: Callable[[], Any]) -> Any:
        """The route's database work, off the event loop (app.config lease_threads says on which threads)."""
        return await anyio.to_thread.run_sync(work, limiter=self.limiter)

    async def steps(self, make: Callable[[Rows], Steps[T]]) -> T:
        """The route's leasing steps in one transaction: on PostgreSQL on the event loop (its statements
        awaited, the loop free meanwhile), without the hop to a thread and back and the threads' turns at the
        GIL (64 agents, 4 alternating rounds on the 2-core VM: server CPU per lease+release 6.05 -> 5.66 ms,
        lease p99 median 23 -> 18 ms); SQLite's driver has no async form, so there on a thread."""
        if self.db.loop_conns is not None:
            async with self.db.aplain() as p:
                return await p.drive(make(p))

        def work() -> T:
            with self.db.plain() as p:
                return p.drive(make(p))
        return await self.run(work)


async def _worker(request: Request) -> Fleet:
    state = request.app.state
    return Fleet(state.db, state.settings, await authorize(request, WORKER), limiter=state.lease_limiter)


async def _acting(request: Request, worker: Annotated[str | None, Header(
        alias=WORKER_HEADER, min_length=1, max_length=128, pattern=NAME_PATTERN,
        description="the worker id acting: the one the lease was granted to (required with a worker token)")] = None
                  ) -> Fleet:
    """A worker token acts only on leases it took, as the worker they were granted to (workers may share a
    token); an admin (or auth off) on any lease of its images, as any worker unless it names one."""
    f = await _worker(request)
    if f.who.role != "admin" and worker is None:
        raise Invalid(f"{WORKER_HEADER}: the id of the worker acting on the lease is required", WORKER_HEADER)
    return f._replace(caller=leasing.Caller(None if f.who.role == "admin" else f.who.token_id, worker,
                                            f.who.digests))


Worker = Annotated[Fleet, Depends(_worker)]
Acting = Annotated[Fleet, Depends(_acting)]


@router.post("/v1/leases", response_model=LeaseOut,
             responses={204: {"description": f"no work for this identity; the {IDLE_HEADER} header says why"}})
async def lease(body: LeaseIn, f: Worker) -> LeaseOut | Response:
    f.who.check_digest(body.image_digest)
    out = await f.steps(lambda p: leasing.lease_batch(p, body, f.settings, f.who.token_id,
                                                      bind_worker=f.who.role == "worker"))
    if out is not None:
        return _json(out)

    def why() -> tuple[str, int]:
        with f.db.session(write=False) as s:
            return idle.idle_reason(s, body, f.who.digests), idle.in_flight(s, body, f.who.digests)
    reason, leased = await f.run(why)
    return Response(status_code=204, headers={IDLE_HEADER: header_value(reason), IN_FLIGHT_HEADER: str(leased)})


# The lease routes answer with their model already built and serialized by pydantic (declared as
# response_model for the API document): FastAPI does not validate and encode it a second time.
def _json(out: BaseModel) -> Response:
    return Response(out.model_dump_json(), media_type="application/json")


@router.post("/v1/leases/{lease_id}/heartbeat", response_model=HeartbeatOut)
async def heartbeat(lease_id: LeaseId, f: Acting) -> Response:
    return _json(await f.steps(lambda p: leasing.heartbeat(p, lease_id, f.settings, f.caller)))


def _take(lease_id: str, body: ResultIn, request: Request, f: Fleet) -> ResultOut:
    """One result in its own transaction; raises the problem its post answers."""
    out = leasing.take_result(f.db, lease_id, body, f.settings, f.caller)
    if isinstance(out, leasing.Refused):  # committed: the refused try counts, a superseded record is kept
        request.app.state.metrics.results.labels(bounded(body.backend, BACKENDS), out.outcome, "false").inc()
        raise out.error
    if not out.duplicate:
        request.app.state.metrics.results.labels(bounded(body.backend, BACKENDS), body.status,
                                                 str(out.verified).lower()).inc()
    return out


@router.post("/v1/leases/{lease_id}/results", response_model=ResultOut)
async def post_result(lease_id: LeaseId, body: ResultIn, request: Request, f: Acting) -> Response:
    return _json(await f.run(lambda: _take(lease_id, body, request, f)))


@router.post("/v1/leases/{lease_id}/results/batch", response_model=ResultsOut)
async def post_results(lease_id: LeaseId, body: ResultsIn, request: Request, f: Acting) -> Response:
    """Several results, each taken (or refused) as its own post would be, answered in order: one request and
    one authentication for what a worker finished within a second."""
    def work() -> ResultsOut:
        outcomes = []
        for r in body.results:
            try:
                outcomes.append(ResultOutcome(shape_id=r.shape_id, status=200,
                                              result=_take(lease_id, r, request, f)))
            except DomainError as e:
                outcomes.append(ResultOutcome(shape_id=r.shape_id, status=e.status, field=e.field,
                                              detail=e.detail))
        return ResultsOut(outcomes=outcomes)
    return _json(await f.run(work))


@router.post("/v1/leases/{lease_id}/release", response_model=ReleaseOut)
async def release(lease_id: LeaseId, f: Acting, body: ReleaseIn | None = None) -> Response:
    started = body.started if body is not None else []
    why = body.reason if body is not None else None
    n = await f.steps(lambda p: leasing.release(p, lease_id, f.settings, f.caller, started, why))
    return _json(ReleaseOut.model_construct(lease_id=lease_id, requeued=n))
