"""HTTP client for the service.

An unreachable or busy service (connection errors, timeouts, 429, 502/503/504) is waited out with capped
exponential backoff and jitter, honouring Retry-After, without a time limit: a worker outlives any outage and
only a stop (a signal) or `retry_for_s` (tests) ends the wait; every `outage_log_every_s` of it the worker says
so. A 401 or 403 is `Fatal`: the token is missing, unknown, revoked, of another role or not scoped to this image,
and no retry can change that, so the worker ends with the reason. Any other 4xx is the service refusing this one
request: it is raised as `Refused` (409 on the lease itself: `LeaseLost`) for the caller to count and move on.

The worker's own calls (lease, heartbeat, result, release, build report, image tables) go through urllib3's
connection pool, bodies encoded and checked by pydantic in one pass: ~0.3-0.5 ms of CPU a call against
1.1-1.5 ms through httpx (benchmarks/RESULTS.md, orchestration overhead), paid on every shape a worker tunes.
Its transport errors are raised as httpx's (ConnectError, ReadTimeout, ...), so callers see one set.
`http` (httpx) stays for everything else: captures, overlays, verification, tests.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import urllib3
from pydantic import BaseModel, ValidationError
from tenacity import (RetryCallState, Retrying, retry_if_exception_type, retry_if_result, stop_after_delay,
                      stop_never, wait_exponential_jitter)

from app import wire  # the one wire format (pydantic only: no FastAPI or SQLAlchemy in a worker)

log = logging.getLogger("aiter_tuner.worker")

RETRY_STATUS = frozenset({429, 502, 503, 504})  # the service (or its database) is busy or away: wait, never give up
FATAL_STATUS = frozenset({401, 403})  # this worker's token: no retry changes it
TRANSPORT = (httpx.TransportError,)  # connect/read/write errors and timeouts
BACKOFF_CAP_S = 30.0
OUTAGE_LOG_EVERY_S = 30.0
M = TypeVar("M", bound=BaseModel)


class Fatal(Exception):
    """A permanent error (a missing, unknown, revoked or wrong-role token; a request this worker's own settings
    make invalid): retrying cannot help, the worker ends non-zero with this reason."""


class LeaseLost(Exception):
    """The service no longer holds this lease for us (expired or released)."""


class ServiceError(Exception):
    """The service could not answer (a 5xx that is not an outage, or an outage outlasting retry_for_s)."""


class Refused(ServiceError):
    """The service refused this request (4xx): the field it names and why."""

    def __init__(self, status: int, field: str | None, detail: str):
        super().__init__(f"{status} {field or ''}: {detail}")
        self.status, self.field, self.detail = status, field, detail


class Stopped(ServiceError):
    """The worker is stopping: the call was abandoned while waiting for the service."""


@dataclass(frozen=True)
class Reply:
    """A service answer, read whole."""

    method: str
    path: str
    status_code: int
    headers: Mapping[str, str]  # case-insensitive (urllib3's HTTPHeaderDict)
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


def _as_httpx(e: urllib3.exceptions.HTTPError) -> httpx.TransportError:
    if isinstance(e, (urllib3.exceptions.NewConnectionError, urllib3.exceptions.SSLError)):
        return httpx.ConnectError(str(e))  # refused, unresolvable, or a TLS handshake that failed
    if isinstance(e, urllib3.exceptions.ConnectTimeoutError):
        return httpx.ConnectTimeout(str(e))
    if isinstance(e, urllib3.exceptions.ReadTimeoutError):
        return httpx.ReadTimeout(str(e))
    return httpx.NetworkError(str(e))  # the connection dropped mid-call (ProtocolError)


def _last_reply(rs: RetryCallState) -> Reply:
    """Retries spent on an answer to retry (a 503 outlasting retry_for_s): that answer, for _json to raise on."""
    assert rs.outcome is not None  # tenacity calls this only after an attempt
    reply: Reply = rs.outcome.result()
    return reply


def _problem(status: int, field: str | None, detail: str) -> LeaseLost | Refused:
    """A 4xx as what the caller handles: the lease lost to us (409 on the lease itself) or this request refused."""
    if status == 409 and field in ("lease_id", None):
        return LeaseLost(detail)
    return Refused(status, field, detail[:2000])


def _outcome(r: Reply, o: wire.ResultOutcome) -> wire.ResultOut | LeaseLost | Refused:
    """One result's answer in a batch: its ResultOut, or the problem its own post would have raised."""
    if o.status >= 400:
        return _problem(o.status, o.field, o.detail or "")
    if o.result is None:
        raise ServiceError(f"{r.path}: the answer is not a ResultsOut: outcome {o.status} of shape {o.shape_id} "
                           f"carries no result")
    return o.result


class ServiceClient:
    def __init__(self, base_url: str, timeout_s: float = 30.0, retry_for_s: float | None = None,
                 token: str | None = None, backoff_cap_s: float = BACKOFF_CAP_S,
                 stop: threading.Event | None = None, outage_log_every_s: float = OUTAGE_LOG_EVERY_S):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s, headers=headers)
        # the worker's calls: kept-alive connections (one per thread that calls: the agent and its heartbeat),
        # a dropped one replaced before use; no retries or redirects of its own (_call retries)
        self._pool = urllib3.connection_from_url(base_url, maxsize=4, timeout=urllib3.Timeout(timeout_s),
                                                 retries=False)
        self._prefix = (urllib3.util.parse_url(base_url).path or "").rstrip("/")
        self._headers = {**headers, "Content-Type": "application/json", "Accept": "application/json"}
        self.retry_for_s, self.backoff_cap_s = retry_for_s, backoff_cap_s
        self._backoff = wait_exponential_jitter(multiplier=0.2, max=backoff_cap_s, jitter=0.5)
        self.stop = stop or threading.Event()  # set by the agent's signal handler: ends any wait
        self.retries = 0  # outages ridden out (503s, connection errors)
        self.base_url, self.outage_log_every_s = base_url, outage_log_every_s
        self._outage_logged_at = 0.0  # when the current wait was last reported (monotonic)
        self.idle_reason: str | None = None  # why the last lease request got no work
        self.in_flight = 0  # shapes of this identity leased (to anyone) at the last 'no work': they may come back

    def act_as(self, worker_id: str) -> None:
        """Every later call says which worker acts: the service lets it touch only leases granted to it."""
        self.http.headers[wire.WORKER_HEADER] = worker_id
        self._headers[wire.WORKER_HEADER] = worker_id

    def close(self) -> None:
        self.http.close()
        self._pool.close()

    def _wait(self, rs: RetryCallState) -> float:
        backoff = self._backoff(rs)
        r = rs.outcome.result() if rs.outcome is not None and not rs.outcome.failed else None
        after = r.headers.get("Retry-After", "") if r is not None else ""
        hint = float(after) if after.replace(".", "", 1).isdigit() else 0.0
        return min(max(backoff if hint == 0 else hint, 0.05), self.backoff_cap_s)

    def _before_sleep(self, rs: RetryCallState) -> None:
        """The first failure of a call, then one line every outage_log_every_s while it lasts: a worker waiting
        on a dead service says so instead of going quiet."""
        self.retries += 1
        now = time.monotonic()
        if rs.attempt_number == 1 or now - self._outage_logged_at >= self.outage_log_every_s:
            self._outage_logged_at = now
            o = rs.outcome
            why = (f"{type(o.exception()).__name__}: {o.exception()}" if o is not None and o.failed
                   else f"HTTP {o.result().status_code}" if o else "?")
            log.warning("service at %s unreachable for %.0f s: %s; retrying (attempt %d)", self.base_url,
                        rs.seconds_since_start or 0.0, why, rs.attempt_number)

    def _sleep(self, seconds: float) -> None:
        if self.stop.wait(seconds):
            raise Stopped("stopping while waiting for the service")

    def _request(self, method: str, path: str, body: bytes | None, as_worker: str | None = None) -> Reply:
        headers = self._headers if as_worker is None else {**self._headers, wire.WORKER_HEADER: as_worker}
        try:
            r = self._pool.urlopen(method, self._prefix + path, body=body, headers=headers, retries=False,
                                   redirect=False)
        except urllib3.exceptions.HTTPError as e:
            raise _as_httpx(e) from e
        return Reply(method, path, r.status, r.headers, r.data)

    def _call(self, method: str, path: str, body: bytes | None = None, retry: bool = True,
              as_worker: str | None = None) -> Reply:
        """retry=False: one try (a heartbeat thread has its own loop). Once stopping, one try then Stopped."""
        if not retry:
            return self._request(method, path, body)
        retrying = Retrying(
            retry=retry_if_exception_type(TRANSPORT) | retry_if_result(lambda r: r.status_code in RETRY_STATUS),
            stop=stop_after_delay(self.retry_for_s) if self.retry_for_s is not None else stop_never,
            wait=self._wait, sleep=self._sleep, before_sleep=self._before_sleep, reraise=True,
            retry_error_callback=_last_reply)
        return retrying(self._request, method, path, body, as_worker)

    def _json(self, r: Reply) -> Any:
        if r.status_code < 400:
            try:
                return r.json()
            except ValueError:  # a proxy's or load balancer's page: not the service's answer, retried later
                raise ServiceError(f"{r.method} {r.path}: {r.status_code} answer is not JSON (a proxy's page?): "
                                   f"{r.text[:200]!r}") from None
        try:
            problem = r.json()
            field, detail = problem.get("field"), str(problem.get("detail", r.text))
        except ValueError:
            field, detail = None, r.text[:500]
        if r.status_code in FATAL_STATUS:
            cause = "missing or refused" if r.status_code == 401 else "not allowed to do this"
            raise Fatal(f"the service at {self.base_url} answered {r.status_code} to {r.method} {r.path}: "
                        f"this worker's token is {cause} ({detail})")
        if r.status_code < 500:
            raise _problem(r.status_code, field, detail)
        raise ServiceError(f"{r.method} {r.path}: {r.status_code} {r.text[:500]}")

    def _check(self, model: type[M], body: dict[str, Any]) -> M:
        """What we post must be valid on the wire: a bad value is refused here, the way the service would."""
        try:
            return model.model_validate(body)
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or None
            raise Refused(422, field, f"{field}: {err['msg']} (checked before sending)") from None

    def _send(self, model: type[BaseModel], body: dict[str, Any]) -> bytes:
        return self._check(model, body).model_dump_json().encode()

    def _answer(self, model: type[M], r: Reply) -> M:
        """The service's answer as its wire model (a 4xx or 5xx raised as _json says)."""
        try:
            return model.model_validate(self._json(r))
        except ValidationError as e:
            raise ServiceError(f"{r.path}: the answer is not a {model.__name__}: {e}") from None

    def lease(self, body: dict[str, Any]) -> wire.LeaseOut | None:
        try:
            sent = self._send(wire.LeaseIn, body)
        except Refused as e:  # built from the worker's own settings: it would be invalid on every try
            raise Fatal(f"the lease request is invalid: {e.detail}") from None
        r = self._call("POST", "/v1/leases", sent)
        if r.status_code == 204:  # no work: the service says why (logged once per new reason)
            reason = r.headers.get(wire.IDLE_HEADER, "no work for this worker")
            if reason != self.idle_reason:
                log.info("%s", reason)
            self.idle_reason = reason
            n = r.headers.get(wire.IN_FLIGHT_HEADER, "0")
            self.in_flight = int(n) if n.isdigit() else 0  # a service without the header: none
            return None
        return self._answer(wire.LeaseOut, r)

    def heartbeat(self, lease_id: str) -> wire.HeartbeatOut:
        return self._answer(wire.HeartbeatOut, self._call("POST", f"/v1/leases/{lease_id}/heartbeat", retry=False))

    def post_result(self, lease_id: str, body: dict[str, Any]) -> wire.ResultOut:
        r = self._call("POST", f"/v1/leases/{lease_id}/results", self._send(wire.ResultIn, body))
        return self._answer(wire.ResultOut, r)

    def post_results(self, lease_id: str, bodies: list[dict[str, Any]], as_worker: str | None = None
                     ) -> list[wire.ResultOut | LeaseLost | Refused]:
        """Results of one lease in one request (at most wire.MAX_RESULTS), each answered as its own post_result
        would be: its ResultOut, or the LeaseLost or Refused that call would raise (one invalid here is refused
        without being sent). A problem with the request as a whole (the lease gone, an outage) raises. as_worker:
        the worker the lease was granted to, when not this one (a twin's spooled results)."""
        out: list[wire.ResultOut | LeaseLost | Refused | None] = [None] * len(bodies)
        sent: list[tuple[int, wire.ResultIn]] = []
        for i, body in enumerate(bodies):
            try:
                sent.append((i, self._check(wire.ResultIn, body)))
            except Refused as e:
                out[i] = e
        if sent:
            batch = wire.ResultsIn.model_construct(results=[m for _, m in sent])  # each checked just above
            r = self._call("POST", f"/v1/leases/{lease_id}/results/batch", batch.model_dump_json().encode(),
                           as_worker=as_worker)
            if r.status_code == 404 and self._route_missing(r):  # a service older than the batch route
                for i, m in sent:
                    out[i] = self._one(lease_id, m, as_worker)
            else:
                for (i, _), o in zip(sent, self._answer(wire.ResultsOut, r).outcomes, strict=True):
                    out[i] = _outcome(r, o)
        return [o for o in out if o is not None]  # every slot filled: checked and refused, or answered

    @staticmethod
    def _route_missing(r: Reply) -> bool:
        """A 404 naming no field: no such route (an unknown lease is a 404 naming lease_id)."""
        try:
            return r.json().get("field") is None
        except (ValueError, AttributeError):
            return True

    def _one(self, lease_id: str, result: BaseModel, as_worker: str | None = None
             ) -> wire.ResultOut | LeaseLost | Refused:
        r = self._call("POST", f"/v1/leases/{lease_id}/results", result.model_dump_json().encode(),
                       as_worker=as_worker)
        try:
            return self._answer(wire.ResultOut, r)
        except (LeaseLost, Refused) as e:
            return e

    def release(self, lease_id: str, started: list[int] | None = None, reason: str | None = None
                ) -> wire.ReleaseOut:
        body = self._send(wire.ReleaseIn, {"started": started or [], "reason": reason[:500] if reason else None})
        return self._answer(wire.ReleaseOut, self._call("POST", f"/v1/leases/{lease_id}/release", body))

    def post_build(self, body: dict[str, Any]) -> wire.BuildOut:
        return self._answer(wire.BuildOut, self._call("POST", "/v1/builds", self._send(wire.BuildIn, body)))

    def put_tables(self, digest: str, body: dict[str, Any]) -> Any:
        return self._json(self._call("PUT", f"/v1/images/{digest}/tables", json.dumps(body).encode()))
