"""Prometheus metrics, one registry per app: counters from requests, gauges read from the database."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import func, select
from starlette.types import ASGIApp, Receive, Scope, Send

from app.db.models import Campaign, CampaignShape, Lease, utcnow


# label values come from a closed set, so no client can grow the exposition (3,000 invented HTTP methods once
# made it 5.4 MB): anything else is "other"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
BACKENDS = frozenset({"torch", "aiter", "triton"})


def bounded(value: str, allowed: frozenset[str]) -> str:
    return value if value in allowed else "other"


def status_class(code: int) -> str:
    return str(code) if 100 <= code <= 599 else "other"


class Metrics:
    def __init__(self, db):  # type: ignore[no-untyped-def]
        self.registry = CollectorRegistry()
        self.captures = Counter("aiter_tuner_captures_received", "Captures accepted", ["family", "format"],
                                registry=self.registry)
        self.results = Counter("aiter_tuner_results", "Results posted", ["backend", "status", "verified"],
                               registry=self.registry)
        self.latency = Histogram("aiter_tuner_request_seconds", "Request latency", ["method", "route", "status"],
                                 registry=self.registry)
        self.background_failures = Counter(
            "aiter_tuner_background_failures", "Rounds of a background task (sweep, checkpoint) that failed; the "
            "next round runs (why: busy database, or error, logged)", ["task", "why"], registry=self.registry)
        self.registry.register(_DbCollector(db))


class _DbCollector:
    def __init__(self, db):  # type: ignore[no-untyped-def]
        self.db = db

    def collect(self):  # type: ignore[no-untyped-def]
        shapes = GaugeMetricFamily("aiter_tuner_shapes", "Shapes by state", labels=["family", "state"])
        leases = GaugeMetricFamily("aiter_tuner_leases", "Leases by state (active ones past expiry: expired)",
                                   labels=["state"])
        with self.db.session(write=False) as s:
            for fam, state, n in s.execute(select(Campaign.family, CampaignShape.state, func.count())
                                           .join(Campaign, Campaign.id == CampaignShape.campaign_id)
                                           .group_by(Campaign.family, CampaignShape.state)):
                shapes.add_metric([fam, state], n)
            now = utcnow()
            counts: dict[str, int] = {}
            for state, exp in s.execute(select(Lease.state, Lease.expires_at)):
                key = "expired" if state == "active" and exp < now else state
                counts[key] = counts.get(key, 0) + 1
            for state in ("active", "expired", "released", "done"):
                leases.add_metric([state], counts.get(state, 0))
        yield shapes
        yield leases


class DemandCollector:
    """The work queued per worker identity (app/services/demand.py) as gauges, for one scrape: built per request
    with the caller's digest scope, so a scoped token's scrape names its own images only."""

    def __init__(self, db, default_cost: float, digests):  # type: ignore[no-untyped-def]
        self.db, self.default_cost, self.digests = db, default_cost, digests

    def collect(self):  # type: ignore[no-untyped-def]
        from app.services.demand import demand
        labels = ["image_digest", "gfx", "cu_num"]
        shapes = GaugeMetricFamily("aiter_tuner_queued_shapes", "Shapes queued per worker identity (leased ones "
                                   "are held by running workers)", labels=labels)
        secs = GaugeMetricFamily("aiter_tuner_queued_gpu_seconds_estimate", "Estimated device seconds of the queued "
                                 "shapes per worker identity (each campaign's median race seconds per shape, else "
                                 "TUNER_DEFAULT_SHAPE_COST_S)", labels=labels)
        with self.db.session(write=False) as s:
            d = demand(s, self.default_cost, self.digests)
        for row in d["identities"]:
            key = [row["image_digest"], row["gfx"], str(row["cu_num"])]
            shapes.add_metric(key, row["queued_shapes"])
            secs.add_metric(key, row["gpu_s_queued_est"])
        yield shapes
        yield secs


def exposition(metrics: Metrics, db, default_cost: float, digests) -> bytes:  # type: ignore[no-untyped-def]
    """/metrics: the app's registry, then the demand gauges for this caller's scope."""
    scoped = CollectorRegistry()
    scoped.register(DemandCollector(db, default_cost, digests))
    return generate_latest(metrics.registry) + generate_latest(scoped)


class LatencyMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app, self.metrics = app, metrics
        self._children: dict[tuple, Any] = {}  # bounded: routes x closed methods x status codes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), {"code": 500}

        async def wrapped(msg):  # type: ignore[no-untyped-def]
            if msg["type"] == "http.response.start":
                status["code"] = msg["status"]
            await send(msg)
        try:
            await self.app(scope, receive, wrapped)
        finally:
            route = scope.get("route")
            key = (bounded(scope["method"], METHODS), getattr(route, "path", None) or "unmatched",
                   status_class(status["code"]))
            child = self._children.get(key)
            if child is None:  # one labelled child per (method, route, status): looked up once
                child = self._children[key] = self.metrics.latency.labels(*key)
            child.observe(time.perf_counter() - t0)
