"""Portable backend: races real GEMM kernels through PyTorch (and Triton on a GPU) for bf16_gemm shapes.

The race is successive halving (`Schedule`): every candidate is screened with a few timed calls (eager on a GPU:
no graph is captured for a candidate the screen drops), each round keeps the best fraction and every candidate
inside the leader's noise band, at most a bounded number, and the finalists (the library default always among
them) are timed in Schedule.captures capture windows (a fresh CUDA-graph capture of each over fresh inputs,
guarded, interleaved with a control kernel whose drift marks a busy window: timed again, or the lease handed
back). Noise is robust (MAD, not stdev). A challenger takes the shape from the default (or the incumbent) only
when it beats it across the windows (torch_decide.decide: sign test or paired t-test, a gain over the 1%
floor); else a tie the holder keeps, with the reason, and a tie over the floor is timed again (the pair alone,
up to Schedule.retimes times). Every finalist is checked against a float64 reference with AITER's error ratio
(a16w16: rtol=atol=5e-2 for 16-bit outputs) and a gross-element test, and two corrupted copies of its output
must fail that check (negative controls, torch_checks). Timing is warm: CUDA-graph replays measured with
device events on a GPU, perf_counter on the CPU, median of the samples. `race="exhaustive"` times and checks
every candidate fully (the baseline benchmarks/early_stop.py compares against). A lease shape with
`finalists` (an image upgrade carried its row) gets a confirmation race: the default, the incumbent and the
finalists only, timed `Schedule.confirm` samples each, the incumbent holding a tie; names this image lacks are
skipped, and an incumbent it lacks means a full race. Rows are written in the lease's tuned header.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from app.wire import ResultStatus
from workers.backends import torch_checks
from workers.backends.base import Batch, Emit, GpuBusy, ShapeResult, now_iso, row_helps
from workers.backends.torch_candidates import (_DTYPES, DEFAULT, MM_BT, SHIFT_BYTES, SPLIT_PARTS, Candidate,
                                               candidates, kernel_catalog, linear_bytes, shifted)
from workers.backends.torch_checks import ERR_MAX, GROSS, check_output, err_ratio, negative_controls, snr_db
from workers.backends.torch_decide import (Entry, Race, Schedule, decide, pooled_sigma, rel_spread,
                                           sign_confidence, versus)
from workers.backends.torch_memory import Plan, RaceMemory, gib
from workers.backends.torch_timer import ReplayFailed, Timer

__all__ = ["DEFAULT", "ERR_MAX", "GROSS", "MM_BT", "SPLIT_PARTS", "Candidate", "Entry", "GpuBusy", "Race",
           "Schedule", "Timer", "TorchBackend", "candidates", "check_output", "err_ratio", "kernel_catalog",
           "negative_controls", "pooled_sigma", "rel_spread", "sign_confidence", "snr_db", "versus"]


class TorchBackend:
    name = "torch"
    families = ["bf16_gemm"]
    IDLE_EVERY_S = 5.0  # the process list is read before a race at most this often (the control kernel between)
    # a capture window's fresh copies of the inputs (_fresh): clones, or shifted (each at a random offset of its own)
    PLACEMENTS = ("clone", "shift")

    def __init__(self, device: str = "cpu", warmup: int = 2, repeats: int = 15, candidate_limit_s: float = 10.0,
                 seed: int = 0, only: list[str] | None = None, race: str = "halving",
                 schedule: Schedule | None = None, min_improvement_pct: float = 3.0,
                 exclude: list[str] | None = None, llc_bytes: int | None = None, busy_drift: float | None = None,
                 busy_retries: int = 3, mem_cap_bytes: int | None = None, placement: str = "clone"):
        if placement not in self.PLACEMENTS:
            raise ValueError(f"placement must be one of {self.PLACEMENTS}, not {placement!r}")
        self.device = torch.device(device)
        self.warmup, self.limit, self.seed = warmup, candidate_limit_s, seed
        self.only = only  # restrict to these candidate names (benchmarks, tests)
        self.exclude = set(exclude or ())  # leave these out: an image without them (benchmarks, tests)
        self.kind = race  # halving | exhaustive
        self.schedule = schedule or Schedule(final=repeats)
        self.min_improvement_pct = min_improvement_pct
        self.timer = Timer(self.device, seed, llc_bytes=llc_bytes, busy_drift=busy_drift)
        self.busy_retries = busy_retries  # re-times of a busy window before the lease goes back
        self._inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.dtype, torch.Tensor] | None = None
        self._window = 0
        self._check_ref: tuple[torch.Tensor, torch.dtype] | None = None  # what a capture window's guard checks
        self.snr_min_db: float | None = None  # an fp8 family's SNR gate (aiter_replay), None: no gate
        self.memory = RaceMemory(self.device, mem_cap_bytes)
        self._plan = Plan(0, math.inf, math.inf)  # the shape's memory plan (tune), unbounded outside a race
        self.placement, self._place_rng = placement, random.Random(seed)

    def _checked(self, out: torch.Tensor, ref: torch.Tensor, out_dtype: torch.dtype) -> tuple[float, str | None]:
        """check_output, then the SNR gate where the family has one."""
        err, why = torch_checks.check_output(out, ref, out_dtype)  # the module's: a test may blind it
        if why is None and self.snr_min_db is not None and (snr := snr_db(out, ref)) < self.snr_min_db:
            why = f"SNR {snr:.1f} dB under {self.snr_min_db:g} dB"
        return err, why

    def kernel_catalog(self) -> dict[str, list[str]]:
        """{family: names} for PUT /v1/images/{digest}/tables (workers/cli.py)."""
        return {f: kernel_catalog() for f in self.families}

    @property
    def builds(self) -> bool:
        """Whether the compile lane has anything to build: Triton configs, on a GPU."""
        if self.device.type != "cuda":
            return False
        try:
            import triton  # noqa: F401
        except ImportError:
            return False
        return True

    def warm(self, lease: dict[str, Any], budget_s: float, should_stop: Callable[[], bool] = lambda: False
             ) -> dict[str, Any]:
        """The compile lane (outside every lease): call every candidate once for each dtype of the lease's
        shapes, with and without bias, so each Triton config compiles once per process here and never inside
        a race (M is not specialised; triton_gemm.py). Returns the wire's build report fields."""
        t0, failed, built = time.monotonic(), [], 0
        kinds: dict[tuple[str, str], tuple[str, str]] = {}  # (dtype, outdtype) -> one shape's (N, K)
        for item in lease["shapes"]:
            s = item["shape"]
            if s.get("dtype") in _DTYPES and s.get("outdtype") in _DTYPES:
                kinds.setdefault((s["dtype"], s["outdtype"]), (s["N"], s["K"]))
        for (dtype, outdtype), (n, k) in kinds.items():
            for bias in ("False", "True"):
                shape = {"M": "64", "N": n, "K": k, "bias": bias, "dtype": dtype, "outdtype": outdtype}
                a, b, bv = self.inputs(shape)
                for c in candidates(a, b, bv, _DTYPES[outdtype]):
                    if should_stop() or time.monotonic() - t0 > budget_s:
                        return {"seconds": time.monotonic() - t0, "ok": False,
                                "output_tail": f"stopped after {built} builds"}
                    try:
                        c.fn()
                        built += 1
                    except Exception as ex:  # a config that cannot build fails its race later, not the lane
                        failed.append(f"{c.name}: {type(ex).__name__}: {str(ex)[:200]}")
        self.timer.sync()
        tail = "\n".join([f"{built} candidate builds", *failed])[-20_000:]
        return {"seconds": time.monotonic() - t0, "ok": not failed, "output_tail": tail}

    def run(self, batch: Batch, emit: Emit) -> None:
        for item in batch.lease["shapes"]:
            if batch.should_stop() or batch.time_left() <= 0:
                return  # the rest goes back to the queue when the agent releases the lease
            res = self.tune(batch, item)
            if res is None:  # stopped mid-shape: abandon it, the release re-queues it
                return
            emit(res)

    def inputs(self, shape: dict[str, str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        m, n, k = int(shape["M"]), int(shape["N"]), int(shape["K"])
        dtype = _DTYPES[shape["dtype"]]
        g = torch.Generator(device="cpu").manual_seed(self.seed + m * 31 + n * 17 + k)
        a = torch.randn(m, k, generator=g).to(self.device, dtype)
        b = (torch.randn(n, k, generator=g) / k ** 0.5).to(self.device, dtype)
        bias = torch.randn(n, generator=g).to(self.device, dtype) if shape["bias"] == "True" else None
        return a, b, bias

    def tune(self, batch: Batch, item: dict[str, Any], kind: str | None = None,
             inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None) -> ShapeResult | None:
        t0, started = time.monotonic(), now_iso()
        shape, sid = item["shape"], item["shape_id"]

        def failed(why: str) -> ShapeResult:
            return ShapeResult(sid, ResultStatus.FAILED, error=why, elapsed_s=time.monotonic() - t0,
                               started_at=started, finished_at=now_iso())
        unsupported = [f for f in ("scaleAB", "bpreshuffle") if shape.get(f) == "True"]
        if unsupported or shape.get("dtype") not in _DTYPES or shape.get("outdtype") not in _DTYPES:
            return failed(f"torch backend cannot run {shape} ({unsupported or 'dtype'})")
        if self.timer.watch.due(self.IDLE_EVERY_S):  # nvidia-smi costs ~50 ms: not every shape
            idle = self.timer.watch.look()
            if idle.others:
                raise GpuBusy(f"other processes on {self.device} before the race: {idle.describe()}")
        m, n, e_in = int(shape["M"]), int(shape["N"]), _DTYPES[shape["dtype"]].itemsize
        pad = 4 * SHIFT_BYTES if self.placement == "shift" else 0  # a, b, bias and the pre-transposed weight
        plan = self._plan = self.memory.plan(m, n, int(shape["K"]), e_in, shape["bias"] == "True", pad)
        # before the inputs and the reference (they alone may not fit), and the default with them: no race without
        default = linear_bytes(m * n, e_in, _DTYPES[shape["outdtype"]].itemsize)
        if plan.budget < default:
            return failed(self._short(plan, default))
        self.timer.ready()  # the process's own buffers, made once and held: no race's peak
        base = self.memory.peak_start()
        oom = None
        try:
            race, ref, out_dtype, note = self._race(batch, item, shape, kind, inputs)
        except torch.OutOfMemoryError as ex:  # past what the candidates' own failures caught: the shape's
            oom = str(ex).splitlines()[0][:300]
        finally:
            self._inputs = self._check_ref = None
            self._plan = Plan(0, math.inf, math.inf)
        if oom is not None:  # out of the except block: its traceback no longer holds the race's tensors
            self.memory.recover()
            return failed(f"out of memory racing the shape (planned {gib(plan.bound)} at once): {oom}")
        if race is None:
            return None
        note["memory"] = {**plan.record(), "peak_gib": self.memory.peak_gib(base)}
        return self._verdict(batch, item, race, ref, out_dtype, t0, started, note)

    def _race(self, batch: Batch, item: dict[str, Any], shape: dict[str, str], kind: str | None,
              inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None
              ) -> tuple[Race | None, torch.Tensor, torch.dtype, dict[str, Any]]:
        a, b, bias = inputs or self.inputs(shape)
        out_dtype = _DTYPES[shape["outdtype"]]
        ref = a.double() @ b.double().t() + (bias.double() if bias is not None else 0)
        cands = [c for c in candidates(a, b, bias, out_dtype)
                 if (not self.only or c.name in self.only) and c.name not in self.exclude]
        kind, cands, note = self._confirmation(item, cands, kind or self.kind)
        # a confirmation race keeps a tie for the incumbent (the full race's pick), and the default must beat it
        # across capture windows to take the shape back (issue 34: M=200 N=8192 K=7392 went to F.linear on
        # one capture of the incumbent that ran 7% slow, although both full races timed it 6-7% faster)
        first = [item.get("incumbent"), DEFAULT] if kind == "confirm" else [DEFAULT, item.get("incumbent")]
        protected = [n for n in first if n]
        self._inputs, self._check_ref = (a, b, bias, out_dtype, ref), (ref, out_dtype)
        race = {"exhaustive": self.exhaustive, "confirm": self.confirm}.get(kind, self.halving)(
            cands, ref, out_dtype, batch, protected)
        return race, ref, out_dtype, note

    def _short(self, plan: Plan, default: int) -> str:
        cap = f" under the {gib(self.memory.cap)} cap" if self.memory.cap is not None else ""
        return (f"not raced: the shape holds about {gib(plan.fixed)} whatever is raced (its inputs, a capture "
                f"window's fresh copies, the float64 reference and checks) and its default {gib(default)}, "
                f"with {gib(self.memory.MARGIN)} kept free; {gib(plan.room)} is free for it{cap}")

    @staticmethod
    def _confirmation(item: dict[str, Any], cands: list[Candidate], kind: str
                      ) -> tuple[str, list[Candidate], dict[str, Any]]:
        """A shape carried over an image upgrade (issue 24) names the old race's finalists: race only the
        default, the incumbent and those this image still has. An incumbent it lacks: a full race."""
        finalists, incumbent = item.get("finalists") or [], item.get("incumbent")
        if not finalists:
            return kind, cands, {}
        names = {c.name for c in cands}
        if incumbent not in names:
            return kind, cands, {"full_race_why": f"incumbent {incumbent!r} is not among this image's candidates"}
        wanted = {DEFAULT, incumbent, *finalists}
        return "confirm", [c for c in cands if c.name in wanted], {
            "skipped": [f for f in finalists if f not in names]}

    # -- the races ----------------------------------------------------------------------------------------

    def _prepare(self, e: Entry, graph: bool = True) -> bool:
        """First call (any compile happens here: once per config per process) and the replayable form: a
        captured graph, or (the screen) eager calls. A candidate that alone holds more than the shape's memory
        budget is out with the reason."""
        if e.nbytes > self._plan.budget:
            e.error = (f"not raced: it holds about {gib(e.nbytes)} (buffers, a graph's outputs) and the shape's "
                       f"race has {gib(self._plan.budget)} for its candidates")
            return False
        try:
            t0 = time.perf_counter()
            e.replay = self.timer.replayable(e.cand.fn) if graph else self.timer.eager(e.cand.fn)
            e.graphed = graph
            first = time.perf_counter() - t0
            if first > self.limit:
                e.error = f"exceeded the {self.limit}s candidate limit ({first:.1f}s)"
                self._free(e)
                return False
            return True
        except Exception as ex:  # a kernel that raises (out of memory too) is a failed candidate, never a winner
            self._failed(e, ex)
            return False

    def _failed(self, e: Entry, ex: BaseException) -> None:
        """A candidate that raised is out with the reason; out of memory, its memory and the cache go back (the
        traceback dropped first: its frames hold the tensors the call made)."""
        e.error = f"{type(ex).__name__}: {ex}"[:500]
        try:
            self.timer.sync()
        except Exception:  # noqa: S110 - the candidate is out already; a sticky error shows on the next call
            pass
        self._free(e)
        if isinstance(ex, torch.OutOfMemoryError):
            e.error = f"out of memory: {str(ex).splitlines()[0][:300]}"
            ex.__traceback__ = None
            self.memory.recover()

    @staticmethod
    def _free(e: Entry) -> None:
        """Its graph and the buffers its calls keep go back (a later use makes them again)."""
        e.replay = None
        e.cand.release()

    def _check(self, e: Entry, ref: torch.Tensor, out_dtype: torch.dtype) -> bool:
        """The output against the reference, then both negative controls on it: a control the check does not
        catch voids the check, and the candidate with it."""
        try:
            _, out = self.timer.once(e.cand.fn)
            e.err, why = self._checked(out, ref, out_dtype)
            if why is None:
                why = negative_controls(out, ref, out_dtype)
            del out  # no output is held through the race (issue 50's memory), nor the buffers of one not held
            if e.replay is None:
                e.cand.release()
        except Exception as ex:
            self._failed(e, ex)
            return False
        if why is not None:
            e.error = why
            return False
        e.checked = True
        return True

    def _held(self, entries: list[Entry]) -> list[list[Entry]]:
        """The entries in groups the shape's memory budget holds at once (one group where all fit), and the plan's
        bound raised to the largest."""
        groups: list[list[Entry]] = self.memory.groups(entries, self._plan.budget)  # type: ignore[assignment]
        self._plan.bound = max(self._plan.bound, self._plan.fixed + max((sum(e.nbytes for e in g) for g in groups),
                                                                        default=0))
        return groups

    def _sample(self, entries: list[Entry], n: int, final: bool = False, graph: bool | None = None) -> None:
        """n samples of each entry, interleaved. Where the race's candidates do not all fit the memory budget at
        once (Plan.spread), group by group (_held), each made (`graph`: captured, else eager) before its samples
        and freed after them; else in the form each is in, or made in `graph`'s, and held."""
        live = [e for e in entries if e.error is None and (e.replay or graph is not None)]
        groups = self._held(live) if graph is not None else [live]
        for group in groups:
            if graph is not None:
                group = [e for e in group if (e.replay and e.graphed == graph) or self._prepare(e, graph)]
            self._sample_held(group, n, final)
            if self._plan.spread:
                for e in group:
                    self._free(e)

    def _sample_held(self, live: list[Entry], n: int, final: bool) -> None:
        """n samples of each held entry; one whose replay raises is out with the reason, the rest sampled again."""
        eager = [e for e in live if e.replay and not e.graphed]
        for group in (eager, [e for e in live if e.replay and e.graphed]):
            if not group or n <= 0:
                continue
            try:
                got = self.timer.sample([e.replay for e in group], n, lead=group is eager)  # type: ignore[misc]
            except ReplayFailed as f:
                self._failed(group[f.index], f.error)
                self._sample_held([e for e in group if e.error is None], n, final)
                continue
            for e, ts in zip(group, got):
                (e.final if final else e.samples if e.graphed else e.screen).extend(ts)
                e.sampled_s += sum(ts) * e.replay[1]  # type: ignore[index]
                if sum(ts) > self.limit:
                    e.error = f"exceeded the {self.limit}s candidate limit while sampling"

    def _prepared(self, cands: list[Candidate], batch: Batch, graph: bool = True,
                  make: Callable[[Entry], bool] | None = None) -> tuple[list[Entry], list[Entry]] | None:
        """Each candidate made ready by `make`, or else its first call and replayable form; where they do not all
        fit the memory budget at once, each is freed again at once (its rounds make it again, group by group:
        _sample). (every entry, the live ones); None: stopped."""
        fit = [c for c in cands if c.nbytes <= self._plan.budget]  # the rest are failed candidates (_prepare)
        spread = self._plan.spread = len(self.memory.groups(fit, self._plan.budget)) > 1

        def ready(e: Entry) -> bool:
            if not self._prepare(e, graph):
                return False
            if spread:
                self._free(e)
            return True
        entries: list[Entry] = []
        live: list[Entry] = []
        for c in cands:
            if batch.should_stop():
                return None
            if live and batch.time_left() <= 0:
                break  # past the budget: the race ends with the candidates prepared so far
            e = Entry(c)
            entries.append(e)
            if (make or ready)(e):
                live.append(e)
        return entries, live

    def exhaustive(self, cands: list[Candidate], ref: torch.Tensor, out_dtype: torch.dtype, batch: Batch,
                   protected: list[str]) -> Race | None:
        """The baseline: every candidate checked, warmed and timed fully, interleaved like the final round. Each
        is captured, checked and warmed alone and freed before the next (all 59 held at once ran an 80 GB H100
        out of memory at M=6144 N=12288 K=1536, issue 50); the final round captures afresh, window by window."""
        def warmed(e: Entry) -> bool:
            ok = self._prepare(e) and self._check(e, ref, out_dtype)
            try:
                if ok:
                    self.timer.sample([e.replay], self.warmup)  # type: ignore[list-item]
            except ReplayFailed as f:
                self._failed(e, f.error)
                ok = False
            self._free(e)
            return ok
        got = self._prepared(cands, batch, make=warmed)
        if got is None:
            return None
        entries, live = got
        race = Race(entries, "exhaustive")
        self._final(race, live, self.schedule.final)
        for e in entries:
            e.rounds = 1 if e.final else 0
        return self._settled(race, protected, self.schedule.final)  # the same rule as the halving race

    def confirm(self, cands: list[Candidate], ref: torch.Tensor, out_dtype: torch.dtype, batch: Batch,
                protected: list[str]) -> Race | None:
        """A confirmation race: the few named candidates checked and timed `Schedule.confirm` samples each,
        interleaved, no screen and no warm-up round (the capture's replay is the warm-up)."""
        got = self._prepared(cands, batch)
        if got is None:
            return None
        entries, live = got
        live = [e for e in live if self._check(e, ref, out_dtype)]
        race = Race(entries, "confirm")
        for e in entries:
            self._free(e)
        self._final(race, live, self.schedule.confirm)
        for e in live:
            e.rounds = 1
        return self._settled(race, protected, self.schedule.confirm)

    def halving(self, cands: list[Candidate], ref: torch.Tensor, out_dtype: torch.dtype, batch: Batch,
                protected: list[str]) -> Race | None:
        """Successive halving (Schedule.rounds), then the checked survivors' final round and the decision."""
        sch, discarded = self.schedule, self.timer.discarded_s
        got = self._prepared(cands, batch, graph=not sch.eager_screen)
        if got is None:
            return None
        entries, live = got
        survivors = self._rounds(live, batch, protected)
        if survivors is None:
            return None
        for e in entries:
            self._free(e)  # the final round captures afresh, window by window
        race = Race(entries, "halving", discarded_s=self.timer.discarded_s - discarded)
        self._final(race, self._finalists(entries, survivors, ref, out_dtype), sch.final)
        return self._settled(race, protected, sch.final)

    def _rounds(self, live: list[Entry], batch: Batch, protected: list[str]) -> list[Entry] | None:
        """The halving rounds: each samples the survivors and keeps the best (_survivors). None: stopped."""
        sch = self.schedule
        for r, (n, keep, cap) in enumerate(sch.rounds):
            if batch.should_stop():
                return None
            if r and batch.time_left() <= 0:
                break
            graph = bool(r) or not sch.eager_screen  # past the screen: the survivors' graphs, captured once each
            self._sample(live, n, graph=graph)
            if r == 0:  # the default and incumbent get enough samples to estimate sigma from the start
                self._sample([e for e in live if e.name in protected], max(0, sch.protect_samples - n), graph=graph)
            live = self._survivors([e for e in live if e.error is None], keep, cap, protected)
        return live

    def _finalists(self, entries: list[Entry], survivors: list[Entry], ref: torch.Tensor, out_dtype: torch.dtype
                   ) -> list[Entry]:
        """The survivors that pass the check; where none does, the next candidate in screening order that does."""
        finalists = [e for e in survivors if self._check(e, ref, out_dtype)]
        if finalists:
            return finalists
        for e in sorted((e for e in entries if e not in survivors and e.times and e.error is None),
                        key=lambda e: e.median):
            if self._check(e, ref, out_dtype):
                return [e]
        return []

    def _fresh(self, window: int, names: set[str]) -> dict[str, Candidate]:
        """Window 0 times the race's own candidates; every later window fresh copies of the inputs and fresh
        candidates over them (their own buffers, so one placement's luck does not decide): those named. A clone
        may land where the last window's was (the caching allocator); placement "shift" moves each copy."""
        if not window or self._inputs is None:
            return {}
        a, b, bias, out_dtype, _ = self._inputs
        place = (lambda t: shifted(t, self._place_rng)) if self.placement == "shift" else None
        copy = place or torch.Tensor.clone
        fresh = copy(a), copy(b), copy(bias) if bias is not None else None, out_dtype
        return {c.name: c for c in (candidates(*fresh, place) if place else candidates(*fresh)) if c.name in names}

    def _final(self, race: Race, entries: list[Entry], n: int, windows: int | None = None,
               per: int | None = None) -> None:
        """The final round: `windows` (Schedule.captures) capture windows, each a fresh capture of every entry
        (over fresh inputs after the first) and of nothing else, guarded (one replay checked against the
        reference before its samples count), then n / windows samples of each (or `per`) and of the control
        kernel, interleaved (_time_window). A window whose control drifted is timed again (Timer.window_state):
        up to busy_retries times; where the drift held when the control was timed again alone (busy), the lease
        then goes back (GpuBusy); where it did not (a noisy window), the last attempt is booked."""
        windows = windows or self.schedule.captures
        per = per or self.schedule.per_window(n)
        for _ in range(windows):
            live = [e for e in entries if e.error is None]
            if not live:
                return
            w = self._window = self._window + 1
            for attempt in range(self.busy_retries + 1):
                if self.timer.on_window:
                    self.timer.on_window(w, attempt)
                live = [e for e in live if e.error is None]
                timed, control_s = self._time_window(live, per, self._fresh(race.windows, {e.name for e in live}))
                if not timed:
                    return
                if self._retime(race, w, attempt, control_s):
                    continue
                for e, ts, calls in timed:
                    e.final.extend(ts)
                    e.caps.append((w, ts))
                    e.sampled_s += sum(ts) * calls
                race.windows += 1
                break

    def _time_window(self, live: list[Entry], per: int, fresh: dict[str, Candidate]
                     ) -> tuple[list[tuple[Entry, list[float], int]], float]:
        """One capture window, group by group (as many entries as the memory budget holds at once: _held; one
        group where all fit): each group captured, its graphs timed interleaved with the control kernel, then
        freed with their buffers before the next group is captured. (entry, its samples, the calls a sample
        holds) for each, and the slowest group's control median. A replay that raises is out with the reason
        and its group timed again without it."""
        timed: list[tuple[Entry, list[float], int]] = []
        controls: list[float] = []
        for group in self._held(live):
            reps = self._captured(group, fresh)
            while reps:
                try:
                    got = self.timer.sample([r for _, r in reps] + [self.timer.control()], per)
                except ReplayFailed as f:
                    if f.index == len(reps):  # the control kernel itself: no candidate's fault
                        raise f.error from f
                    self._failed(reps[f.index][0], f.error)
                    reps = [x for x in reps if x[0].error is None]
                    continue
                controls.append(statistics.median(got[-1]))
                timed += [(e, ts, calls) for (e, (_, calls)), ts in zip(reps, got)]
                break
            del reps  # the group's graphs, then the buffers their calls kept
            for e in group:
                self._free(e)
                if e.name in fresh:
                    fresh[e.name].release()
        return timed, max(controls, default=0.0)

    def _captured(self, live: list[Entry], fresh: dict[str, Candidate]
                  ) -> list[tuple[Entry, tuple[Callable[[], Any], int]]]:
        """A fresh capture of each live entry, guarded: one replay checked against the reference before its
        samples count (an entry whose replay is wrong, or that raises, is out with the reason)."""
        reps = []
        for e in live:
            try:
                run, calls, guarded = self.timer.capture(fresh.get(e.name, e.cand).fn)
                why = None
                if self._check_ref is not None:
                    why = self._checked(guarded(), *self._check_ref)[1]
            except Exception as ex:
                self._failed(e, ex)
                continue
            if why is not None:
                e.error = f"capture guard: the captured graph's replay is wrong ({why})"
                continue
            reps.append((e, (run, calls)))
        return reps

    def _retime(self, race: Race, w: int, attempt: int, control_s: float) -> bool:
        """Whether window w must be timed again: its control drifted (Timer.window_state). A busy window on its
        last attempt hands the lease back (GpuBusy); a noisy one (the drift gone when the control was timed
        again alone) is booked on its last attempt."""
        state, why = self.timer.window_state(control_s)
        if state == "clean":
            return False
        (race.busy if state == "busy" else race.noisy).append(f"window {w} attempt {attempt + 1}: {why}")
        if state == "busy" and self.timer.on_busy:
            self.timer.on_busy(why or "")
        if attempt == self.busy_retries:
            if state == "busy":
                raise GpuBusy(f"{len(race.busy)} busy capture windows, the last after {self.busy_retries} "
                              f"re-times: {why}")
            return False
        time.sleep(0.05 * 2 ** attempt)  # let a passing neighbour go
        return True

    def _settled(self, race: Race, protected: list[str], n: int) -> Race:
        """Decide; while a tie kept a protected entry ahead of a gain over the floor (race.contested), time the
        pair again, alone, up to Schedule.retimes times (retime_windows fresh capture windows each; n more
        samples each where the race has no windows) and decide once more. Then free the graphs."""
        sch = self.schedule
        decide(race, protected, sch)
        while race.contested is not None and race.challenger is not None and race.retimes < sch.retimes:
            pair = [race.contested, race.challenger]
            if any(e.error is not None for e in pair):
                break
            if race.windows:
                self._final(race, pair, sch.retime_windows * sch.retime_per_window, windows=sch.retime_windows,
                            per=sch.retime_per_window)
            else:
                self._sample(pair, n, final=True)
            race.retimes += 1
            race.resampled = True
            decide(race, protected, sch)
        for e in race.entries:
            self._free(e)  # the graphs and the buffers go back
        return race

    def _survivors(self, live: list[Entry], keep: float, cap: int, protected: list[str]) -> list[Entry]:
        if not live:
            return live
        ranked = sorted(live, key=lambda e: e.median)
        lead = ranked[0]
        sigma = pooled_sigma(ranked, self.schedule.floor)
        top = max(1, math.ceil(keep * len(ranked)))
        out, kept = [], 0
        for i, e in enumerate(ranked):
            band = self.schedule.band(sigma, len(e.times), len(lead.times), self.schedule.floor)
            if e.name in protected or (kept < cap and (i < top or e.median <= lead.median * (1 + band))):
                kept += e.name not in protected
                e.rounds += 1
                out.append(e)
            else:
                self._free(e)  # out of the race: its graph's memory goes back
        return out

    def _decide(self, race: Race, protected: list[str]) -> Race:
        return decide(race, protected, self.schedule)

    # -- the result ---------------------------------------------------------------------------------------

    def _verdict(self, batch: Batch, item: dict[str, Any], race: Race, ref: torch.Tensor, out_dtype: torch.dtype,
                 t0: float, started: str, note: dict[str, Any]) -> ShapeResult:
        sid, shape = item["shape_id"], item["shape"]
        default = next((e for e in race.entries if e.name == DEFAULT and e.final), None)
        done: dict[str, Any] = {"candidates": [e.record() for e in race.entries], "started_at": started,
                "default_us": default.median * 1e6 if default else None,
                "race": {"kind": race.kind, "samples": race.samples, "sampled_s": race.sampled_s,
                         "finalists": race.finalists, "sigma": race.sigma,
                         "fastest": race.fastest.name if race.fastest else None, "resampled": race.resampled,
                         "retimes": race.retimes,
                         "discarded_s": race.discarded_s, "windows": race.windows, "busy": race.busy,
                         "noisy": race.noisy,
                         "decision": race.decision, "reason": race.reason, "confidence": race.confidence, **note}}
        win = race.winner
        if win is None or not win.checked:
            return ShapeResult(sid, ResultStatus.FAILED, error=race.error or "no winner", **done,
                               elapsed_s=time.monotonic() - t0, finished_at=now_iso())
        # every finalist passed both negative controls in _check (a control that did not fire failed it)
        done["timing"] = {"decision": race.decision, "reason": (race.reason or "")[:1000],
                          "windows": race.windows, "busy_windows": len(race.busy), **win.stats()}
        done["confidence"] = race.confidence
        done["spread"] = win.stats()["spread"]
        us = win.median * 1e6
        helps = row_helps(us, done["default_us"], self.min_improvement_pct)  # the default itself: 0% gain
        row = self._row(batch.lease, shape, win, us) if helps else None
        return ShapeResult(sid, ResultStatus.OK if helps else ResultStatus.DEFAULT_BEST, row=row, us=us, err_ratio=win.err,
                           kernel_name=win.name, **done, elapsed_s=time.monotonic() - t0, finished_at=now_iso())

    @staticmethod
    def _row(lease: dict[str, Any], shape: dict[str, str], win: Entry, us: float) -> dict[str, str]:
        m, n, k = int(shape["M"]), int(shape["N"]), int(shape["K"])
        elem = 4 if shape["dtype"] == "torch.float32" else 2
        vals = dict(shape, gfx=lease["gfx"], cu_num=str(lease["cu_num"]), libtype=win.cand.libtype, solidx="0",
                    splitK=str(win.cand.split_k), us=f"{us:.4f}", kernelName=win.name,
                    err_ratio=f"{win.err:.4f}", tflops=f"{2 * m * n * k / us / 1e6:.2f}",
                    bw=f"{(m * k + n * k + m * n) * elem / us / 1e3:.2f}")
        return {c: vals.get(c, "") for c in lease["tuned_header"]}
