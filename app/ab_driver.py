"""The serving A/B's driver (issue 32): runs beside the servers, like the capture agent (httpx and pydantic only).

Per arm it points at a given endpoint, or starts a server with the user's launch command carrying that arm's
AITER_CONFIG_* files (downloaded from the service for the arm's version), waits for its health, warms it, asks it
the accuracy prompts (the servers start in the run's start_order), and then measures the run's passes (its own
load loop, or vLLM's / SGLang's bench client: app/ab_bench.py) in the service's order (band by band, rounds in
ab_stats.ROUND_ORDERS), posting each pass whole with the server log lines of its window from every rank.
When every planned pass is in, the service books the run or extends its undecided bands (sequential rounds), and
the driver measures those too.
A re-drive continues with the passes the service does not have. A fault (an endpoint that does not answer, a
server that died) interrupts the run with its reason; the pass in flight is not posted.
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.ab_bench import PRESETS, BenchFailed, BenchLoad
from app.ab_prompts import PROMPTS
from app.ab_wire import ARMS, Arm, ArmIn, NodeProbe, OperatingPoint, PassIn, RequestRecord
from app.domain import log_ranks

ACCURACY_TOKENS = 16  # each accuracy prompt's greedy tokens (app/ab_prompts.py; checked by ab_gate.accuracy)
SERVER_GONE_FRAC = 0.5  # a pass with more failed requests than this asks whether the server is still there
PROBE_SLEEP_S = 0.02  # the node probe's sleep (LagProbe)
# A pass during which the driver's loop woke this late was measured on a stalled node: it is measured again, at
# most STALL_RETRIES times (5 sleeps late; on this project's 2-core VM with 4 gate shards side by side the largest
# lag of ~250 quiet passes was 0.064 s, the median 0.005 s: benchmarks/RESULTS.md). On a node whose ordinary
# passes already wake later than that (busy host CPUs), the limit is STALL_FACTOR x the median largest lag of the
# run's earlier passes (once there are STALL_BASELINE of them), so only the unusual pass is measured again.
STALL_S = 0.1
STALL_RETRIES = 2
STALL_FACTOR = 5.0
STALL_BASELINE = 5


ONE_LOG = "{log}"  # the default: the server's one log, ranks told apart by their lines' prefixes
UNRESOLVED = "<"  # deploy.plan's placeholder for a folder the service does not know ("<aiter package>/...")


class Fault(Exception):
    """The drive cannot go on: the run is interrupted with this reason (resumable)."""


@dataclass
class ArmServer:
    arm: Arm
    url: str
    log_files: list[Path]  # the server's one log, or one per rank where asked (--rank-log)
    proc: subprocess.Popen | None = None
    workdir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    ranks: int = 1  # the ranks the server runs: each must show in what is posted, even with nothing logged

    def offsets(self) -> list[int]:
        return [f.stat().st_size if f.exists() else 0 for f in self.log_files]

    def read_since(self, offs: list[int] | None = None) -> dict[str, str]:
        """rank -> the lines logged since offs (None: since the server's start), each file split by the rank
        its lines' prefixes name (app/domain/log_ranks.py: one file as vLLM and SGLang write it)."""
        texts = {}
        for rank, (f, o) in enumerate(zip(self.log_files, offs or [0] * len(self.log_files))):
            if f.exists():
                with open(f, "rb") as fh:
                    fh.seek(o)
                    texts[str(rank)] = fh.read().decode("utf-8", "replace")
            else:
                texts[str(rank)] = ""
        return log_ranks.by_rank(texts, self.ranks)

    def died(self) -> str | None:
        if self.proc is not None and self.proc.poll() is not None:
            return f"arm {self.arm}'s server exited with code {self.proc.returncode}"
        return None


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_LIBC: Any = None


def _child_setup(parent: int) -> Any:
    """What a launched server runs between fork and exec: its own process group (the driver kills the group, so a
    launch command's own children go too), and on Linux PR_SET_PDEATHSIG, so the kernel sends it SIGTERM when the
    driver dies, even by SIGKILL, when no handler of ours can run (the kernel ties it to the thread that forked:
    the driver starts servers from its event loop's thread, which lives as long as the run). A launch command that
    forks its server (a shell that does not exec) leaves that grandchild to the group kill of stop(), which a
    SIGKILL skips. libc is loaded before the fork: nothing is imported or allocated in the child."""
    global _LIBC
    if sys.platform.startswith("linux") and _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    libc = _LIBC

    def setup() -> None:
        os.setpgid(0, 0)
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != parent:  # the driver died before prctl took: nobody would send the signal
                os._exit(1)

    return setup


# A launch runs through a shell, as the README writes it (redirects, pipes, tee). A shell forks the server rather
# than exec it (dash always, bash where a redirect follows), and the kernel's death signal (_child_setup) is not
# inherited across a fork: so the launched process is this keeper, which gets the signal, runs `sh -c` in its
# own process group and, on SIGTERM, ends that group (the shell, the server and whatever it started).
# The handler only signals: the main thread's wait then returns once the shell has gone (a second wait inside
# the handler would block on the first one's lock); whatever outlives SIGTERM by 10 s is killed.
_SHELL_KEEPER = """
import os, signal, subprocess, sys, threading
sh = subprocess.Popen(["/bin/sh", "-c", sys.argv[1]])
def end(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)
    threading.Timer(10, os.killpg, (0, signal.SIGKILL)).start()
signal.signal(signal.SIGTERM, end)
rc = sh.wait()
os._exit(128 - rc if rc < 0 else rc)
"""


def _kill_group(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM to the server's process group, SIGKILL to it when the server has not exited in timeout_s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            if proc.poll() is None and sig == signal.SIGTERM:
                proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


class LagProbe:
    """How late the driver's event loop wakes from PROBE_SLEEP_S sleeps while a pass runs (app/ab_wire.py
    NodeProbe): a node that stalls wakes everything late, the arms' servers with it."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(PROBE_SLEEP_S)
            self.lags.append(max(0.0, time.monotonic() - t - PROBE_SLEEP_S))

    def __enter__(self) -> LagProbe:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()

    def result(self) -> NodeProbe:
        n = len(self.lags)
        return NodeProbe(samples=n, lag_max_s=max(self.lags, default=0.0),
                         lag_mean_s=sum(self.lags) / n if n else 0.0)


def _load() -> Any:
    from app import ab_load  # type: ignore[attr-defined]  # the load generator (a separate module, same package)
    return ab_load


def pass_seed(run_seed: int, band: str, repeat: int) -> int:
    """Every arm of a round gets the same prompts: the pairing compares servers, not prompts."""
    h = hashlib.blake2b(f"{run_seed}:{band}:{repeat}".encode(), digest_size=4).digest()
    return int.from_bytes(h, "big")


class Driver:
    def __init__(self, service: str, token: str | None, run_id: int, *, model: str, workdir: Path,
                 endpoints: dict[str, str] | None = None, logs: dict[str, str] | None = None,
                 launch: str | None = None, ranks: int = 1, rank_log: str = ONE_LOG,
                 health_timeout_s: float = 120.0, request_timeout_s: float = 60.0, warmup_requests: int = 4,
                 max_passes: int | None = None, stall_s: float | None = STALL_S,
                 stall_retries: int = STALL_RETRIES, load_cmd: str | None = None, load_name: str = "own") -> None:
        self.service, self.run_id, self.model = service.rstrip("/"), run_id, model
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.workdir, self.endpoints, self.logs, self.launch = workdir, endpoints or {}, logs or {}, launch
        self.ranks, self.rank_log = ranks, rank_log
        self.health_timeout_s, self.request_timeout_s = health_timeout_s, request_timeout_s
        self.warmup_requests, self.max_passes = warmup_requests, max_passes
        self.stall_s, self.stall_retries = stall_s, stall_retries
        # the load: the own loop, or a load generator of the field (vllm bench serve, sglang.bench_serving)
        self.bench = BenchLoad(load_cmd, workdir) if load_cmd else None
        self.load_name = load_name  # what the passes record as their load (ab_wire.PassIn.load)
        self.lags: list[float] = []  # the largest lag of each posted pass: the node's ordinary lag
        self.servers: dict[str, ArmServer] = {}
        self.t0 = time.monotonic()

    # ---- the service ----
    async def _svc(self, c: httpx.AsyncClient, method: str, path: str, **kw: Any) -> Any:
        r = await c.request(method, self.service + path, headers=self.headers, **kw)
        if r.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:500]}")
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text

    # ---- the arms' servers ----
    def _log_files(self, base: str) -> list[Path]:
        if "{rank}" not in self.rank_log:
            return [Path(self.rank_log.format(log=base))]
        return [Path(self.rank_log.format(log=base, rank=r)) for r in range(self.ranks)]

    async def _arm_env(self, c: httpx.AsyncClient, arm: str, version_id: int | None) -> dict[str, str]:
        """AITER_CONFIG_* of the arm's version (none for the shipped tables), files downloaded into its folder."""
        env = {"AITER_LOG_TUNED_CONFIG": "1"}
        if version_id is None:
            return env
        v = await self._svc(c, "GET", f"/v1/ab/versions/{version_id}")
        d = self.workdir / arm
        d.mkdir(parents=True, exist_ok=True)
        for f in v["files"]:
            text = await self._svc(c, "GET", f"/v1/ab/versions/{version_id}/{f['family']}.csv")
            if hashlib.sha256(text.encode()).hexdigest() != f["sha256"]:
                raise Fault(f"arm {arm}: version {version_id}'s {f['family']} file does not match its sha256")
            bad = [p for p in f["paths"] if p != "@overlay" and (UNRESOLVED in p or not p.startswith("/"))]
            if bad:  # AITER skips a path that does not exist: B would serve the overlay without the shipped rows
                raise Fault(f"arm {arm}: version {version_id}'s {f['env_var']} names {bad[0]!r}, a path no server "
                            "can open (the image's configs folder was unknown when it was frozen); nothing was "
                            "started: report the image's tables with their configs_dir and freeze a new version")
            path = d / f["name"]
            path.write_text(text)
            env[f["env_var"]] = ":".join(str(path) if p == "@overlay" else p for p in f["paths"])
        return env

    def _launch(self, arm: str, env: dict[str, str]) -> ArmServer:
        """The arm's server: its endpoint, or started by the launch command (not waited for)."""
        if arm in self.endpoints:
            logs = self.logs.get(arm)
            srv = ArmServer(arm, self.endpoints[arm], self._log_files(logs) if logs else [],  # type: ignore[arg-type]
                            ranks=self.ranks)
        elif self.launch:
            port = _free_port()
            d = self.workdir / arm
            d.mkdir(parents=True, exist_ok=True)
            log = d / "server.log"
            for f in self._log_files(str(log)):
                f.unlink(missing_ok=True)
            q = {k: shlex.quote(str(v)) for k, v in (("port", port), ("log", log), ("arm", arm),
                                                      ("ranks", self.ranks), ("model", self.model))}
            cmd = self.launch.format(**q)
            out = open(d / "stdout.log", "ab")
            proc = subprocess.Popen([sys.executable, "-c", _SHELL_KEEPER, cmd], env={**os.environ, **env},
                                    stdout=out, stderr=subprocess.STDOUT, preexec_fn=_child_setup(os.getpid()))
            srv = ArmServer(arm, f"http://127.0.0.1:{port}", self._log_files(str(log)), proc, d, env,  # type: ignore[arg-type]
                            self.ranks)
        else:
            raise Fault(f"arm {arm}: neither an endpoint nor a launch command")
        self.servers[arm] = srv  # before its health: stop() ends a server that never became healthy too
        return srv

    async def _health(self, srv: ArmServer) -> None:
        end = time.monotonic() + self.health_timeout_s
        last = ""
        async with httpx.AsyncClient(timeout=5) as hc:
            while time.monotonic() < end:
                if why := srv.died():
                    raise Fault(f"{why} before it was healthy")
                try:
                    if (await hc.get(srv.url + "/health")).status_code == 200:
                        return
                except httpx.HTTPError as e:
                    last = f"{type(e).__name__}: {e}"
                await asyncio.sleep(0.2)
        raise Fault(f"arm {srv.arm}: endpoint {srv.url} unreachable ({last or 'no healthy answer'}) after "
                    f"{self.health_timeout_s:.0f} s")

    async def _alive(self, srv: ArmServer) -> str | None:
        if why := srv.died():
            return why
        try:
            async with httpx.AsyncClient(timeout=5) as hc:
                if (await hc.get(srv.url + "/health")).status_code == 200:
                    return None
        except httpx.HTTPError as e:
            return f"arm {srv.arm}: endpoint {srv.url} unreachable ({type(e).__name__}: {e})"
        return f"arm {srv.arm}: endpoint {srv.url} unhealthy"

    def stop(self) -> None:
        """End the servers this driver launched, each with its process group (what the launch command started)."""
        for srv in self.servers.values():
            if srv.proc is not None:
                _kill_group(srv.proc)

    # ---- the run ----
    async def run(self) -> dict[str, Any]:
        """Drive the run to its end (booked) or to a fault (interrupted, raised as Fault)."""
        own = _load()
        load = self.bench or own
        # a fresh connection per call to the service: a pooled one can be closed by the service's keep-alive timeout
        # (uvicorn: 5 s) while a longer pass runs, and the next post then fails with a ReadError (seen here)
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as c:
            run = await self._svc(c, "POST", f"/v1/ab/runs/{self.run_id}/start")
            points = {OperatingPoint(**p).name: OperatingPoint(**p) for p in run["points"]}
            try:
                if run.get("load") not in (None, self.load_name):  # before any server starts, as the service would
                    raise Fault(f"run {self.run_id}'s passes were measured by the {run['load']!r} load, this drive's "
                                f"is {self.load_name!r}: resume it with that load, or make a new run")
                # every arm's files first: a version that cannot be served is refused before any server starts
                envs = {arm: await self._arm_env(c, arm, run["arms"][arm]) if self.launch and arm not in
                        self.endpoints else {} for arm in ARMS}
                order = run["start_order"] or ARMS
                # every arm's server started at once, in the start order: a server drifts with its age (warm-up,
                # caches, its allocator), so servers of one age drift alike; started one after another (each
                # healthy, warm and answered first) they were 12 s apart, and the control flagged runs for it
                # (benchmarks/RESULTS.md, issue 49). A stays between B and A' for what is left.
                for arm in order:
                    self._launch(arm, envs[arm])
                for arm in order:
                    srv = self.servers[arm]
                    await self._health(srv)
                    await self._warm(load, srv, points, run)
                    answers = await own.greedy_answers(srv.url, self.model, PROMPTS, ACCURACY_TOKENS)
                    # the log from the server's start: a real server logs most hits before it is healthy (vLLM
                    # captures its CUDA graphs first, and AITER logs a shape once per process)
                    await self._svc(c, "POST", f"/v1/ab/runs/{self.run_id}/arms", json=ArmIn(
                        arm=arm, logs=srv.read_since(), answers=answers).model_dump())
                done = 0
                while True:  # finish books the run, or extends its undecided bands (sequential rounds): new todo
                    for todo in run["todo"]:
                        if self.max_passes is not None and done >= self.max_passes:
                            return await self._svc(c, "GET", f"/v1/ab/runs/{self.run_id}")
                        await self._pass(c, load, points[todo["band"]], todo["band"], todo["repeat"], todo["arm"],
                                         run["seed"], todo["n_requests"])
                        done += 1
                    run = await self._svc(c, "POST", f"/v1/ab/runs/{self.run_id}/finish")
                    if not run.get("extended"):
                        return run  # type: ignore[no-any-return]
            except (Fault, httpx.ConnectError) as e:
                reason = str(e) if isinstance(e, Fault) else f"unreachable: {e}"
                await self._svc(c, "POST", f"/v1/ab/runs/{self.run_id}/interrupt", json={"reason": reason[:2000]})
                raise Fault(reason) from None

    async def _warm(self, load: Any, srv: ArmServer, points: dict[str, OperatingPoint], run: dict) -> None:
        """A few requests at each band's concurrency before anything is measured (kernels loaded, graphs
        captured, caches warm); their records are not posted."""
        for name, p in points.items():
            try:
                recs = await load.drive_band(srv.url, self.model, p, arm=srv.arm, repeat=0,
                                             n_requests=max(self.warmup_requests, p.concurrency),
                                             seed=run["seed"] + 7919, started_at=self.t0,
                                             timeout_s=self.request_timeout_s)
            except httpx.ConnectError as e:
                raise Fault(f"arm {srv.arm}: endpoint {srv.url} unreachable while warming ({e})") from None
            except BenchFailed as e:
                raise Fault(f"arm {srv.arm}: no load while warming at {name}: {e}") from None
            if recs and all(r.error for r in recs):
                raise Fault(f"arm {srv.arm}: every warm-up request failed at {name} ({recs[0].error})")

    def stall_limit(self) -> float:
        """The lag over which a pass counts as stalled: STALL_S, or STALL_FACTOR x this node's ordinary lag."""
        base = sorted(self.lags)[len(self.lags) // 2] if len(self.lags) >= STALL_BASELINE else 0.0
        return max(self.stall_s or 0.0, STALL_FACTOR * base)

    async def _pass(self, c: httpx.AsyncClient, load: Any, point: OperatingPoint, band: str, repeat: int, arm: str,
                    run_seed: int, n: int) -> None:
        srv = self.servers[arm]
        if why := await self._alive(srv):
            raise Fault(why)
        offs = srv.offsets()
        for stalled in range(self.stall_retries + 1):
            try:
                with LagProbe() as probe:
                    recs: list[RequestRecord] = await load.drive_band(
                        srv.url, self.model, point, arm=arm, repeat=repeat, n_requests=n,
                        seed=pass_seed(run_seed, band, repeat), started_at=self.t0,
                        timeout_s=self.request_timeout_s)
            except httpx.ConnectError as e:
                raise Fault(f"arm {arm}: endpoint {srv.url} unreachable during band {band} round {repeat} ({e})") \
                    from None
            except BenchFailed as e:
                raise Fault(f"arm {arm}: no load for band {band} round {repeat}: {e}") from None
            # a pass the node stalled in is measured again: the probe, not the pass's speed, decides (so an arm's
            # own slowness is never measured away; one that stalls the node every time is posted at the last try)
            node = probe.result()
            if self.stall_s is None or node.lag_max_s <= self.stall_limit():
                break
            print(f"band {band} round {repeat} arm {arm}: the node stalled {node.lag_max_s:.3f} s during the pass; "
                  "measured again", file=sys.stderr)
        failed = sum(r.error is not None for r in recs)
        if failed > SERVER_GONE_FRAC * max(1, len(recs)) and (why := await self._alive(srv)):
            raise Fault(f"{why} during band {band} round {repeat} ({failed} of {len(recs)} requests failed); "
                        "the pass is not posted")
        recs = [r.model_copy(update={"band": band}) for r in recs]
        self.lags.append(node.lag_max_s)
        await self._svc(c, "POST", f"/v1/ab/runs/{self.run_id}/passes", json=PassIn(
            band=band, repeat=repeat, arm=arm, records=recs, logs=srv.read_since(offs),
            probe=node.model_copy(update={"stalled_passes": stalled}), load=self.load_name).model_dump())


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_pairs(items: list[str] | None, what: str) -> dict[str, str]:
    """ARM=VALUE pairs; A's value serves A_prime too unless given."""
    out: dict[str, str] = {}
    for it in items or []:
        arm, sep, val = it.partition("=")
        if not sep or arm not in ARMS:
            raise SystemExit(f"{what}: expected ARM=VALUE with ARM one of {', '.join(ARMS)}, got {it!r}")
        out[arm] = val
    if "A" in out and "A_prime" not in out:
        out["A_prime"] = out["A"]
    return out


def drive(args: Any) -> int:
    import json
    d = Driver(args.service, args.token, args.run, model=args.model, workdir=Path(args.workdir),
               endpoints=parse_pairs(args.endpoint, "--endpoint"), logs=parse_pairs(args.log, "--log"),
               launch=args.launch, ranks=args.ranks, rank_log=args.rank_log, health_timeout_s=args.health_timeout,
               max_passes=args.max_passes, stall_s=STALL_S if args.stall_s is None else args.stall_s or None,
               load_cmd=args.load_cmd or PRESETS.get(args.load),
               load_name=f"cmd: {args.load_cmd}"[:300] if args.load_cmd else args.load)
    def _terminated(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # unwinds through the finally below: the launched servers are ended

    old = signal.signal(signal.SIGTERM, _terminated)
    try:
        out = asyncio.run(d.run())
    except Fault as e:
        print(f"interrupted: {e} (re-run the same command to resume)", file=sys.stderr)
        return 3
    finally:
        d.stop()
        signal.signal(signal.SIGTERM, old)
    print(json.dumps({k: out.get(k) for k in ("id", "state", "verdict", "reason", "passes_done", "passes_total",
                                              "rollback_version_id")}, indent=1))
    return 0
