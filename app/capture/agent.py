"""`aiter-tuner capture`: follow a server's log (and its step histogram), post AITER's lookup lines as captures.

One cycle: read the complete lines appended since the spool's position, count each family's shapes with the
service's own grammar (app.domain.log_lines, app.domain.capture_parsing.from_events), read the step histogram's
change, and commit the new captures and the new position to the spool in one write; then post what the spool
holds, oldest first, until the service acknowledges each (201, also for a capture_uid it had already counted).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
from typing import Any

import httpx

from app.schemas import CaptureIn
from app.aiter_install import installed_aiter_version
from app.capture import identity, metrics
from app.capture.spool import Spool
from app.capture.tail import FileFollower, Position, StdinFollower
from app.domain.capture_parsing import from_events
from app.domain.families import FAMILIES
from app.domain.log_lines import LogEvent, described, parse_log

log = logging.getLogger("aiter-tuner.capture")
MAX_SHAPES_PER_CAPTURE = 1000
Lengths = dict[str, dict[str, int]]  # "prompt" / "generation" -> finished requests per length bucket (a delta)
RETRY = {401, 403, 404, 408, 409, 429}  # fixable outside the capture (token, service, load): try again later
_RNG = random.Random()  # retry jitter; seeded from the OS, so two sidecars draw differently


def number(kind: type, env_name: str, positive: bool = True) -> Any:
    """An argparse type for a flag whose default comes from env_name: a bad value is an error naming both,
    raised only when this command parses its flags (never while another subcommand's parser is built)."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or (positive and value <= 0):
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'positive ' if positive else ''}{kind.__name__} "
                                             f"(the flag, or {env_name} in the environment)")
        return value
    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument("--service", default=env("TUNER_SERVICE_URL"), help="service URL (TUNER_SERVICE_URL)")
    p.add_argument("--image-digest", default=env("TUNER_IMAGE_DIGEST"),
                   help="the served image's digest, from the pod spec or `docker inspect` (TUNER_IMAGE_DIGEST)")
    p.add_argument("--gfx", default=env("TUNER_GFX"),
                   help="the GPU's gfx; default: rocminfo's (as get_gfx_runtime reads it), else GPU_ARCHS")
    p.add_argument("--cu-num", type=number(int, "TUNER_CU_NUM"), default=env("TUNER_CU_NUM") or None,
                   help="the GPU's compute units; default: rocminfo's, else CU_NUM")
    p.add_argument("--log", default=env("TUNER_LOG"), help="the server's log file, or - for standard input")
    p.add_argument("--metrics-url", default=env("TUNER_METRICS_URL"),
                   help="vLLM's Prometheus endpoint (http://localhost:8000/metrics): weights shapes by served steps")
    p.add_argument("--spool", default=env("TUNER_SPOOL", "./aiter-capture-spool"),
                   help="state kept across restarts and outages (log position, unsent captures)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="read what is there, post, exit (1: left in the spool)")
    mode.add_argument("--follow", action="store_true", help="keep following (the default)")
    p.add_argument("--interval-s", type=number(float, "TUNER_CAPTURE_INTERVAL_S"),
                   default=env("TUNER_CAPTURE_INTERVAL_S") or "10")
    p.add_argument("--retry-s", type=float, default=30.0, help="--once: how long to retry an unreachable service")
    # TUNER_HOSTNAME, not TUNER_HOST: that one is the address `aiter-tuner serve` listens on
    p.add_argument("--host", default=env("TUNER_HOSTNAME") or socket.gethostname(),
                   help="this server's name as the service shows it (TUNER_HOSTNAME; default: the hostname)")
    p.add_argument("--token", default=None, help="a capture token (default: TUNER_TOKEN)")


class Agent:
    def __init__(self, args: argparse.Namespace, gfx: str, cu_num: int, spool: Spool):
        self.args, self.gfx, self.cu_num, self.spool = args, gfx, cu_num, spool
        tok = args.token or os.environ.get("TUNER_TOKEN")
        self.http = httpx.Client(base_url=args.service.rstrip("/"), timeout=30,
                                 headers={"Authorization": f"Bearer {tok}"} if tok else {})
        self.version = installed_aiter_version()
        self.env = identity.serving_env(dict(os.environ))  # the server's GPU_ARCHS/CU_NUM (the same image's)
        if args.log == "-":
            self.reader: Any = StdinFollower()
        else:
            saved = spool.state["log"]
            pos = (Position(saved["inode"], saved["offset"], saved.get("head", "")) if saved and
                   saved.get("path") == args.log else None)
            self.reader = FileFollower(args.log, pos)
        self.rejected = 0
        self.lines_read = self.made = 0  # this run's: --once says so when the log held no AITER line

    # -- reading -------------------------------------------------------------------------------------------
    def _lines(self, drain: bool) -> list[str]:
        if isinstance(self.reader, StdinFollower):
            return self.reader.read(wait_eof=drain)
        return self.reader.read()

    def _steps(self) -> tuple[dict[str, int], dict[str, float] | None, Lengths, dict[str, dict[str, float]]]:
        """Step counts per bucket since the spool's reading and the reading; the same for the request lengths
        (finished requests per prompt/generation length bucket, where the server exports them)."""
        if not self.args.metrics_url:
            return {}, None, {}, {}
        try:
            r = httpx.get(self.args.metrics_url, timeout=10)
            r.raise_for_status()
            cur = metrics.cumulative(r.text)
            lengths = {k: c for k, name in metrics.LENGTHS.items() if (c := metrics.cumulative(r.text, name))}
        except (httpx.HTTPError, ValueError) as e:
            log.warning("metrics: %s unreadable (%s); step counts wait for the next reading", self.args.metrics_url, e)
            return {}, None, {}, {}
        if not cur:
            log.warning("metrics: no %s histogram at %s", metrics.HISTOGRAM, self.args.metrics_url)
            return {}, None, {}, {}
        seen = self.spool.state.get("lengths") or {}
        grown = {k: d for k, c in lengths.items() if (d := metrics.delta(c, seen.get(k)))}
        return metrics.delta(cur, self.spool.state["metrics"]), cur, grown, lengths

    def collect(self, drain: bool = False, with_metrics: bool = True) -> int:
        """Read new lines and metrics; commit the captures they make and the new position in one spool write.
        Returns the lines read. Without with_metrics (the service is down) step counts stay on the server's
        counter and come in one later delta instead of one spooled capture per cycle."""
        lines = self._lines(drain)
        for note in self.reader.notes:
            log.info("log: %s", note)
        self.reader.notes.clear()
        events = parse_log("\n".join(lines)).events
        steps, cur, lengths, lengths_cur = self._steps() if with_metrics else ({}, None, {}, {})
        made = 0
        for name in sorted({e.family for e in events} | (set(self.spool.state["families"]) if steps else set())):
            made += self._spool_family(name, events, steps, lengths)
        self._commit(len(lines), made, steps, cur, lengths_cur)
        return len(lines)

    def _spool_family(self, name: str, events: list[LogEvent], steps: dict[str, int], lengths: Lengths) -> int:
        """One family's captures from these events (the step delta rides on its first part), added to the spool's
        pending ones (not saved yet); how many."""
        st = self.spool.state
        parsed = from_events(FAMILIES[name], events, self.gfx, self.cu_num, strict=False, env=self.env)
        for note in parsed.notes:
            if "other families" not in note:
                log.warning("%s: %s (agent says %s/%s)", name, note, self.gfx, self.cu_num)
        shapes = [dict(sh.as_dict(), count=n) for sh, n in parsed.shapes.values()]
        if not shapes and not steps:
            return 0
        made = 0
        for part, i in enumerate(range(0, max(len(shapes), 1), MAX_SHAPES_PER_CAPTURE)):
            body = CaptureIn(image_digest=self.args.image_digest, gfx=self.gfx, cu_num=self.cu_num,
                             family=name, aiter_version=self.version, host=self.args.host, env=self.env,
                             shapes=shapes[i:i + MAX_SHAPES_PER_CAPTURE],
                             capture_uid=self.spool.next_uid(name, part),
                             step_buckets=(steps or None) if part == 0 else None,
                             length_buckets=(lengths or None) if part == 0 and steps else None)
            st["pending"].append(body.model_dump(mode="json", exclude_none=True))
            made += 1
        if name not in st["families"]:
            st["families"].append(name)
        return made

    def _commit(self, n_lines: int, made: int, steps: dict[str, int], cur: dict[str, float] | None,
                lengths_cur: dict[str, dict[str, float]]) -> None:
        """The new captures, metrics reading and log position in one spool write (none for an idle cycle)."""
        st = self.spool.state
        before = (st["metrics"], st.get("lengths"), st["log"])
        if cur is not None and made and steps:  # the lengths ride with the steps (a request ends after its steps)
            st["lengths"] = lengths_cur or st.get("lengths")
        if cur is not None and (made or not steps):
            st["metrics"] = cur  # a change with no family to carry it yet waits in the next reading's delta
        if isinstance(self.reader, FileFollower):
            p = self.reader.pos
            st["log"] = {"path": self.args.log, "inode": p.inode, "offset": p.offset, "head": p.head}
        self.lines_read, self.made = self.lines_read + n_lines, self.made + made
        if made:
            st["seq"] += 1
        if made or (st["metrics"], st.get("lengths"), st["log"]) != before:  # an idle cycle writes nothing
            self.spool.save()
        if made:
            log.info("spooled %d capture(s) from %d line(s)%s", made, n_lines,
                     f", {sum(steps.values())} step(s)" if steps else "")

    # -- delivering ----------------------------------------------------------------------------------------
    def deliver(self) -> bool:
        """Post the spool oldest first; True when it is empty. Stops at the first failure worth retrying."""
        while self.spool.pending:
            body = self.spool.pending[0]
            try:
                r = self.http.post("/v1/captures", json=body)
            except httpx.HTTPError as e:
                log.warning("service unreachable (%s); %d capture(s) kept in the spool", e, len(self.spool.pending))
                return False
            if r.status_code >= 500 or r.status_code in RETRY:
                log.warning("service said %s (%s); %d capture(s) kept in the spool", r.status_code, r.text[:200],
                            len(self.spool.pending))
                return False
            if r.status_code >= 400:
                where = self.spool.reject(body, f"{r.status_code} {r.text[:2000]}")
                self.rejected += 1
                log.error("capture refused for good (%s %s); set aside in %s", r.status_code, r.text[:300], where)
            else:
                out = r.json()
                log.info("delivered %s: %s shapes, %s calls%s", body["capture_uid"], out.get("shapes_received"),
                         out.get("calls_added"), " (already counted)" if out.get("duplicate") else "")
            self.spool.pending.pop(0)
            self.spool.save()
        return True

    def close(self) -> None:
        self.http.close()
        self.reader.close()


def _identity(args: argparse.Namespace) -> tuple[str, int] | str:
    missing = [f for f, v in (("--service", args.service), ("--image-digest", args.image_digest),
                              ("--log", args.log)) if not v]
    if missing:
        return f"missing {', '.join(missing)} (or their TUNER_* environment variables)"
    gfx, cu_num = identity.detect(args.gfx, args.cu_num)
    if not gfx or not cu_num:
        return "could not detect gfx/cu_num (no GPU_ARCHS/CU_NUM and no rocminfo): pass --gfx and --cu-num"
    return gfx, cu_num


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s capture %(levelname)s %(message)s")
    ident = _identity(args)
    if isinstance(ident, str):
        print(f"aiter-tuner capture: {ident}", file=sys.stderr)
        return 2
    spool = Spool(args.spool)
    agent = Agent(args, *ident, spool)
    try:
        return _once(agent) if args.once else _follow(agent)
    finally:
        agent.close()
        spool.close()


def jittered(ceiling: float) -> float:
    """A wait drawn from the upper half of the backoff's ceiling: sidecars that lost the service together (a
    restart, an outage) spread their retries instead of arriving in lockstep at every doubling."""
    return _RNG.uniform(ceiling / 2, ceiling)


def _once(agent: Agent) -> int:
    while agent.collect(drain=True):  # a big log takes several reads (each one bounded in bytes)
        pass
    if not agent.made and not agent.spool.pending:  # silence would read as "posted"
        where = "standard input" if agent.args.log == "-" else agent.args.log
        print(f"aiter-tuner capture: nothing to post: no AITER lookup line in {where} ({agent.lines_read} new "
              f"line(s) read{'' if agent.args.log == '-' else ' since the spool last stopped'}). Looked for "
              f"{described()}.", file=sys.stderr)
        return 0
    give_up, ceiling = time.monotonic() + agent.args.retry_s, 0.5
    while not agent.deliver():
        delay = jittered(ceiling)
        if time.monotonic() + delay > give_up:
            log.error("%d capture(s) not delivered; they stay in %s", len(agent.spool.pending), agent.spool.dir)
            return 1
        time.sleep(delay)
        ceiling = min(ceiling * 2, 10.0)
    return 1 if agent.rejected else 0


def _follow(agent: Agent, stop: threading.Event | None = None) -> int:
    if stop is None:
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    ceiling, up = agent.args.interval_s, True
    while not stop.is_set():
        agent.collect(with_metrics=up)
        up = agent.deliver()
        # the service answered: the plain interval; it did not: capped exponential backoff, jittered
        ceiling = agent.args.interval_s if up else min(max(ceiling * 2, 1.0), 300.0)
        stop.wait(ceiling if up else jittered(ceiling))
    agent.collect()
    agent.deliver()
    return 0
