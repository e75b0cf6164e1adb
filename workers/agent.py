"""The worker loop: lease a turn-sized batch, heartbeat while working, post each result, release on stop.

Nothing about one shape ends the loop (arq's rule: a failing job is counted, never fatal): a backend error
becomes that shape's failed result, a refused result is logged, counted and reported as a failed shape, and an
unavailable service is waited out (workers/client.py). Every finished result is written to a local spool
(workers/spool.py) before it is posted and acknowledged there once the service answered, so a crash or a long
outage loses none: the spool is delivered first on the next turn (or the next start). A spool that cannot be
written (a full or read-only disk) is no reason to stop either: the result in hand is kept in memory and posted,
its write retried before every turn, and the lease's other shapes go back to the queue at once rather than be
measured with nowhere safe to keep them. Only a signal, --once with no work left, or a permanent error
(client.Fatal: a missing or refused token) ends it; results already finished stay in the spool for the next start.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from app.wire import MAX_BUDGET_S, MAX_RESULTS, LeaseOut, ResultOut, ResultStatus
from workers.backends.base import Backend, Batch, GpuBusy, ShapeResult, Warms, has_builds, now_iso
from workers.client import Fatal, LeaseLost, Refused, ServiceClient, ServiceError, Stopped
from workers.identity import WorkerIdentity
from workers.spool import Spool

log = logging.getLogger("aiter_tuner.worker")

Payload = dict[str, Any]  # one result as posted (wire.ResultIn's fields): what the spool holds
Item = tuple[str | None, Payload]  # a result waiting for its post: its spool record (None: kept in memory only)


@dataclass
class AgentConfig:
    worker_id: str
    image_digest: str
    budget_s: float
    aiter_commit: str | None = None
    once: bool = False  # stop when the service has no work, queued or in flight (one-shot runs, array jobs)
    poll_s: float = 5.0
    max_batches: int | None = None
    max_shapes: int | None = None
    spool_dir: str | None = None  # where finished results wait for delivery (default: per worker, under ~)
    compile_budget_s: float = 1800.0  # the compile lane's own budget (0: no lane), outside every lease
    post_every_s: float = 1.0  # results finished within this of the last post wait for the next (0: each at once)


@dataclass(frozen=True)
class Budget:
    """The seconds each lease request asks for. A lease that ran out of its own time with a shape unfinished (a
    machine slower than the budget assumed: on a loaded CPU one slow library call can outlast budget + grace)
    makes it twice what that lease ran (budget, grace and the heartbeat that found it gone), so the shape's next
    try has twice the room: sized by what this worker measured, never by a guess of its speed, and never past
    the wire's bound (the service's hard deadline stays the bound on every lease)."""

    asked_s: float

    def after_overrun(self, ran_s: float) -> Budget:
        return Budget(min(MAX_BUDGET_S, 2 * max(self.asked_s, ran_s)))


@dataclass(frozen=True)
class LeaseClock:
    """One lease's time: when its work began, the monotonic deadline every shape must meet (never past the
    lease's budget, nor past the service's hard deadline for it, a second early) and that hard deadline."""

    began: float  # time.monotonic()
    deadline: float  # time.monotonic()
    hard: datetime  # the service's hard deadline (aware, UTC)

    @classmethod
    def start(cls, lease: LeaseOut) -> LeaseClock:
        began = time.monotonic()
        to_hard = (lease.hard_deadline - datetime.now(timezone.utc)).total_seconds() - 1.0
        return cls(began, time.monotonic() + min(lease.budget_s, to_hard), lease.hard_deadline)

    def ran_s(self) -> float:
        return time.monotonic() - self.began

    def past_hard(self) -> bool:
        return datetime.now(timezone.utc) >= self.hard


@dataclass
class Stats:
    batches: int = 0
    posted: int = 0
    released: int = 0
    lost_leases: int = 0
    refused: int = 0  # results the service refused (4xx): reported as failed shapes
    backend_errors: int = 0  # shapes whose backend raised: reported as failed shapes
    busy_handbacks: int = 0  # leases handed back because the GPU was busy (GpuBusy): nothing booked
    superseded: int = 0  # late results for shapes another worker had meanwhile
    overruns: int = 0  # leases that ran out of their own time (budget + grace) with a shape unfinished
    budget: Budget = Budget(0.0)  # what the lease requests ask for (twice an overrun lease's run, from then on)
    spooled: int = 0  # results written to the spool (every finished one)
    spool_faults: int = 0  # spool writes that failed (the result kept in memory instead)
    results: list[dict[str, Any]] = field(default_factory=list)

    @property
    def budget_s(self) -> float:
        """The seconds the lease requests ask for now (the CLI's summary reports it)."""
        return self.budget.asked_s


def default_spool_dir(worker_id: str, service: str) -> Path:
    """Per worker and service (a result belongs to the service whose lease it answers)."""
    base = os.environ.get("TUNER_SPOOL_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME", os.path.expanduser("~/.local/state")), "aiter-tuner", "spool")
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in worker_id)
    return Path(base) / f"{name}-{hashlib.sha256(service.encode()).hexdigest()[:12]}"


class Heartbeat(threading.Thread):
    def __init__(self, client: ServiceClient, lease_id: str, every_s: float):
        super().__init__(daemon=True)
        self.client, self.lease_id, self.every_s = client, lease_id, every_s
        self.done = threading.Event()
        self.lost = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            try:
                self.client.heartbeat(self.lease_id)
            except LeaseLost:
                self.lost.set()
                return
            except Exception as e:  # keep trying; the lease dies on its own if we stay unreachable
                log.warning("heartbeat failed: %s", e)


class LeaseRun:
    """One lease being worked: its clock and heartbeat, the batch its backend runs, the shapes finished, the results
    not yet posted (spooled, or kept in memory) and whether a post of them failed."""

    def __init__(self, agent: Agent, lease: LeaseOut):
        self.lease, self.lid = lease, lease.lease_id
        self.clock = LeaseClock.start(lease)
        self.hb = Heartbeat(agent.client, self.lid, lease.heartbeat_every_s)
        faults = agent.stats.spool_faults
        # a spool fault ends the batch: its other shapes go back to the queue now, not at the lease's expiry.
        # The backends read the lease as its JSON document (the dict the wire carries).
        self.batch = Batch(lease.model_dump(mode="json"), self.clock.deadline,
                           lambda: agent.stop.is_set() or self.hb.lost.is_set() or agent.stats.spool_faults > faults)
        self.finished: set[int] = set()
        self.unposted: list[Item] = []
        self.posted_at = float("-inf")
        self.undelivered = False  # a post of this lease's results failed
        self.handback: str | None = None  # why the backend gave the lease up early (GpuBusy), said on release

    def unfinished(self) -> list[int]:
        return [x.shape_id for x in self.lease.shapes if x.shape_id not in self.finished]

    def cut_short(self) -> bool:
        """Fewer shapes finished than the lease holds."""
        return len(self.finished) < len(self.lease.shapes)


class Agent:
    def __init__(self, client: ServiceClient, backend: Backend, ident: WorkerIdentity, cfg: AgentConfig):
        self.client, self.backend, self.ident, self.cfg = client, backend, ident, cfg
        client.act_as(cfg.worker_id)
        self.stop = client.stop  # one event: a signal also ends any wait for the service
        self.stats = Stats()
        self.warmed: set[str] = set()  # families whose JIT build this worker has warmed for its image
        self.spool = Spool(Path(cfg.spool_dir) if cfg.spool_dir
                           else default_spool_dir(cfg.worker_id, str(client.http.base_url)), cfg.worker_id)
        self.unspooled: list[tuple[str, Payload]] = []  # (lease id, result): finished, not on disk, not posted
        self.stats.budget = Budget(cfg.budget_s)

    def install_signals(self) -> None:
        def _term(signum: int, _frame: Any) -> None:
            log.info("signal %s: finishing the current shape and releasing the lease", signum)
            self.stop.set()
        signal.signal(signal.SIGTERM, _term)
        signal.signal(signal.SIGINT, _term)

    def lease_request(self) -> dict[str, Any]:
        """A wire.LeaseIn's fields (the client checks them before sending: a bad setting is Fatal there)."""
        return {"worker_id": self.cfg.worker_id, "image_digest": self.cfg.image_digest, "gfx": self.ident.gfx,
                "cu_num": self.ident.cu_num, "backends": [self.backend.name], "families": self.backend.families,
                "budget_s": self.stats.budget.asked_s, "host": self.ident.host,
                "aiter_commit": self.cfg.aiter_commit, "max_shapes": self.cfg.max_shapes}

    def run(self) -> Stats:
        while not self.stop.is_set():
            if self.cfg.max_batches is not None and self.stats.batches >= self.cfg.max_batches:
                break
            try:
                self.deliver_spool()
                lease = self.client.lease(self.lease_request())
            except Stopped:
                break
            except LeaseLost as e:  # a 409 naming a lease another replica's sweeper ended meanwhile: not ours
                log.warning("lease request met a lease ended meanwhile (%s); leasing again", e)
                self.stop.wait(min(1.0, self.cfg.poll_s))
                continue
            except ServiceError as e:  # our request refused, or a service fault: count, wait, go on
                self.stats.refused += isinstance(e, Refused)
                log.error("lease request failed: %s", e)
                self.stop.wait(self.cfg.poll_s)
                continue
            if lease is None:
                # --once ends when nothing is queued, nothing of ours waits for delivery, and no shape of this
                # identity is leased: a held one comes back to the queue if its worker was killed mid-lease
                if self.cfg.once and not self._pending() and not self.client.in_flight:
                    break
                self.stop.wait(self.cfg.poll_s)
                continue
            if self.needs_build(lease):
                self.compile_lane(lease)
                continue
            self.run_lease(lease)
        self._respool()
        for lease_id, payload in self.unspooled:  # the disk refused them to the end: the log keeps them
            log.error("result never spooled nor delivered (lease %s): %s", lease_id, json.dumps(payload))
        return self.stats

    def needs_build(self, lease: LeaseOut) -> bool:
        return self.cfg.compile_budget_s > 0 and has_builds(self.backend) and lease.family not in self.warmed

    def compile_lane(self, lease: LeaseOut) -> None:
        """Before the first batch of a family: give the batch back untouched (uncounted), warm the backend's
        builds (AITER's JIT on its first shape; torch on a GPU: every Triton config) under the lane's own budget,
        post the build seconds, then lease again. A JIT build that ran inside a lease would count against it and
        against the tuner's --timeout (ROCm/aiter#5264)."""
        backend = self.backend
        assert isinstance(backend, Warms)  # needs_build said so
        try:
            self.client.release(lease.lease_id)
        except (LeaseLost, ServiceError) as e:
            log.warning("compile lane: release before the build failed: %s", e)
        self.warmed.add(lease.family)
        report = backend.warm(lease.model_dump(mode="json"), self.cfg.compile_budget_s, self.stop.is_set)
        log.info("compile lane: %s built in %.1f s (ok=%s)", lease.family, report["seconds"], report["ok"])
        try:
            self.client.post_build({"image_digest": self.cfg.image_digest, "family": lease.family,
                                    "worker_id": self.cfg.worker_id, "aiter_commit": self.cfg.aiter_commit,
                                    **report})
        except (LeaseLost, ServiceError) as e:  # a report that does not arrive is logged, never fatal
            log.error("compile lane: build report not accepted: %s", e)

    def _put(self, lease_id: str, payload: Payload) -> str | None:
        """The result on disk; None (kept in memory by the caller) when the disk refuses it."""
        try:
            return self.spool.put(lease_id, payload)
        except OSError as e:
            self.stats.spool_faults += 1
            log.error("spool write failed (%s): the result for shape %s is kept in memory", e, payload["shape_id"])
            return None

    def _respool(self) -> None:
        """Results the spool refused earlier: written now if the disk takes them."""
        kept, self.unspooled = self.unspooled, []
        for i, (lease_id, payload) in enumerate(kept):
            if self._put(lease_id, payload) is None:
                self.unspooled += kept[i:]
                return

    def _pending(self) -> list[tuple[str | None, str, Payload]]:
        """Every result not yet delivered: the spool's, then those only in memory (rid None)."""
        try:
            on_disk: list[tuple[str | None, str, Payload]] = list(self.spool.pending())
        except OSError as e:
            log.error("spool unreadable (%s); its results wait for the next turn", e)
            on_disk = []
        return on_disk + [(None, lid, payload) for lid, payload in self.unspooled]

    def deliver_spool(self) -> None:
        """Results finished earlier (an outage, a crash, a spool fault) go out first, in the order they finished."""
        self._respool()
        pending, self.unspooled = self._pending(), []  # what fails again is kept again (_keep)
        chunks: list[tuple[str, list[Item]]] = []
        for lease_id, group in itertools.groupby(pending, key=lambda e: e[1]):
            items = [(rid, payload) for rid, _, payload in group]
            chunks += [(lease_id, items[at:at + MAX_RESULTS]) for at in range(0, len(items), MAX_RESULTS)]
        for i, (lease_id, chunk) in enumerate(chunks):
            try:
                self._deliver(lease_id, chunk)
            except Stopped:  # this and the rest wait for the next turn (or the next start)
                for lid, rest in chunks[i:]:
                    self._keep(lid, rest)
                raise
            except ServiceError as e:  # a fault on these: they stay spooled (or in memory), the rest go out
                self._keep(lease_id, chunk)
                log.error("could not deliver %d spooled results of lease %s: %s", len(chunk), lease_id, e)

    def _keep(self, lease_id: str, items: list[Item]) -> None:
        """Undelivered results the spool does not hold stay in memory for the next turn."""
        self.unspooled += [(lease_id, payload) for rid, payload in items if rid is None]

    def _deliver(self, lease_id: str, items: list[Item]) -> bool:
        """Post spooled results of one lease in one request; False when the service already gave a shape of
        them to another lease. A fault on the request as a whole raises, and they all stay spooled."""
        answers: list[ResultOut | LeaseLost | Refused]
        try:
            answers = self.client.post_results(lease_id, [payload for _, payload in items],
                                               as_worker=self.spool.owner_of(lease_id))
        except (LeaseLost, Refused) as e:  # the request as a whole: the lease gone, or refused for all
            answers = [e] * len(items)
        return all([self._settle(rid, lease_id, payload, a) for (rid, payload), a in zip(items, answers)])

    def _settle(self, rid: str | None, lease_id: str, payload: Payload, answer: ResultOut | LeaseLost | Refused
                ) -> bool:
        """One result's answer: taken, superseded (False) or refused; acknowledged in the spool either way (an
        acknowledgement the disk refuses re-sends it later: the service answers that as a duplicate)."""
        sid = payload["shape_id"]
        if rid is not None:
            try:
                self.spool.done(rid)
            except OSError as e:
                log.warning("spool acknowledgement failed (%s): shape %s will be re-sent", e, sid)
        if isinstance(answer, LeaseLost):  # dead lease, and another worker has the shape now (the service took what it could)
            self.stats.superseded += 1
            log.warning("result for shape %s (lease %s) superseded, not taken: %s", sid, lease_id, answer)
            return False
        if isinstance(answer, Refused):
            self.stats.refused += 1
            log.error("the service refused the result for shape %s (%s): %s", sid, answer.field, answer.detail)
            # reported as a failed shape, unless the lease is not ours to post to (409: ended; 403: another
            # token's, a spool kept across a token's rotation: that post would be refused too, and fatal)
            if payload.get("status") != ResultStatus.FAILED and answer.status not in (403, 409):
                self._post_failed(lease_id, sid, payload.get("backend", self.backend.name),
                                  f"the service refused the result ({answer.field}): {answer.detail}")
            self.stats.results.append({"shape_id": sid, "status": "refused", "field": answer.field})
            return True
        log.info("result for shape %s (lease %s) delivered: result %s", sid, lease_id, answer.result_id)
        self.stats.posted += 1
        self.stats.results.append({"shape_id": sid, "status": payload.get("status"),
                                   **answer.model_dump(mode="json")})
        return True

    def _post_failed(self, lease_id: str, shape_id: int, backend: str, error: str) -> None:
        body = {"shape_id": shape_id, "backend": backend, "status": ResultStatus.FAILED, "error": error[-4000:],
                "aiter_commit": self.cfg.aiter_commit, "finished_at": now_iso()}
        try:
            self.client.post_result(lease_id, body)
        except (LeaseLost, Refused) as e:  # already counted by the service (its refusal counts a try)
            log.info("failed-shape report for %s not taken: %s", shape_id, e)

    def _overran(self, run: LeaseRun) -> None:
        """The lease ran out of its own time with a shape unfinished (its try counted by the expiry): the next
        leases ask for more (Budget.after_overrun)."""
        self.stats.overruns += 1
        self.stats.budget = self.stats.budget.after_overrun(run.clock.ran_s())
        log.warning("lease %s ran out of its budget (%.0f s) and grace with shapes %s unfinished: asking for %.0f s "
                    "per lease from now on", run.lid, run.lease.budget_s, run.unfinished(), self.stats.budget_s)

    # -- one lease: race its batch, post results as they finish, hand back what is left ----------------------

    def run_lease(self, lease: LeaseOut) -> None:
        self.stats.batches += 1
        run = LeaseRun(self, lease)
        run.hb.start()
        try:
            self._race(run)
        finally:
            self._wind_up(run)

    def _race(self, run: LeaseRun) -> None:
        """The backend on the batch; nothing it raises ends the loop but Fatal (from a post inside emit)."""
        try:
            self.backend.run(run.batch, lambda res: self._emit(run, res))
        except Fatal:  # from a post inside emit: no shape's fault; the finished ones stay spooled
            raise
        except GpuBusy as e:  # the device is shared: nothing is booked, the unfinished shapes go back (release)
            self.stats.busy_handbacks += 1
            run.handback = f"GPU busy: {e}"[:500]
            log.warning("lease %s handed back: the GPU is busy: %s", run.lid, e)
        except Exception as e:  # the shape the backend was on fails; the batch's others go back untouched
            current = next(iter(run.unfinished()), None)
            log.error("backend error on shape %s: %s", current, e)
            if current is not None:
                self.stats.backend_errors += 1
                self._emit(run, ShapeResult(current, ResultStatus.FAILED, finished_at=now_iso(),
                                            error=f"backend error: {traceback.format_exc()[-4000:]}"))

    def _emit(self, run: LeaseRun, res: ShapeResult) -> None:
        """A finished shape: spooled (or kept in memory), then posted with those finished since the last post."""
        run.finished.add(res.shape_id)
        payload = res.payload(self.backend.name, self.cfg.aiter_commit)
        rid = self._put(run.lid, payload)
        run.unposted.append((rid, payload))
        self.stats.spooled += rid is not None
        log.info("shape %s finished (%s) for lease %s%s", res.shape_id, res.status, run.lid,
                 ", spooled" if rid is not None else "")
        # at most one post every post_every_s: a shape slower than that is posted as it finishes, faster
        # ones together (one request and transaction-set for several: a short CPU race's overhead halves)
        if (rid is None or time.monotonic() - run.posted_at >= self.cfg.post_every_s
                or len(run.unposted) >= MAX_RESULTS):
            self._post(run)

    def _post(self, run: LeaseRun) -> None:
        if not run.unposted:
            return
        items, run.unposted = run.unposted, []
        run.posted_at = time.monotonic()
        try:
            if not self._deliver(run.lid, items):
                run.hb.lost.set()  # the lease is dead: stop working on its shapes
        except Stopped:  # they stay in the spool for the next start
            self._keep(run.lid, items)
            run.hb.lost.set()
        except ServiceError as e:  # a service fault on these: they stay spooled, the batch goes on
            self._keep(run.lid, items)
            run.undelivered = True
            log.error("could not post the results for shapes %s: %s", [p["shape_id"] for _, p in items], e)

    def _wind_up(self, run: LeaseRun) -> None:
        """After the backend (however it ended): post what finished since the last post, before the release;
        stop the heartbeat; then hand back what is left of the lease."""
        self._post(run)
        if run.undelivered:  # once more: a release would requeue their shapes and supersede the results
            try:
                self.deliver_spool()
            except Stopped:
                run.hb.lost.set()
            run.undelivered = any(held == run.lid for _, held, _ in self._pending())
        run.hb.done.set()
        run.hb.join(timeout=5)
        if run.hb.lost.is_set():
            self.stats.lost_leases += 1
            if run.cut_short() and run.clock.past_hard():
                self._overran(run)
        elif run.undelivered:  # still held: the results are taken late while nobody else has the shapes
            log.warning("results of lease %s undelivered: its shapes stay with it until it expires", run.lid)
        elif run.cut_short():
            try:  # unfinished shapes go straight back to the queue, uncounted
                self.stats.released += self.client.release(run.lid, reason=run.handback).requeued
            except LeaseLost:
                self.stats.lost_leases += 1
            except ServiceError as e:  # the lease expires on its own
                log.warning("release failed: %s", e)
