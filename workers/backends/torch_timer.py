"""Warm device time per call: CUDA-graph replays timed with events on a GPU (perf_counter on the CPU), an
L2/LLC scrub before every sample, a capture guard, and a control kernel whose drift says the device is shared."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from workers import gpu_idle


class ReplayFailed(RuntimeError):
    """A replay raised while it was sampled (an eager call out of memory, say): which one, by its index in the
    batch, and what it raised; the batch's samples are lost, the others' replays are intact."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(f"replay {index} raised {type(error).__name__}: {error}")
        self.index, self.error = index, error


def _call(i: int, fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as ex:
        raise ReplayFailed(i, ex) from ex


@dataclass
class BusyCheck:
    """Is a capture window busy? Its control kernel's median against the idle baseline: the median of the last
    `keep` clean windows' control medians. The fastest window seen (the rule before) ratchets down with every
    lucky window, so ordinary ones later read as +10-15% (two H200 windows flagged after the neighbour had
    gone). A window over max(drift, z x the control's robust spread across those windows) is suspect; it is
    busy only when the control, timed again alone, is still over: a neighbour that is there stays there, a
    slow stretch of one window does not. A noisy window's control still joins the idle history: its
    spread is the control's own.

    Before that repeat the card is let settle (`settle_s`, ended early once its SM clock, where it can be read,
    is back at the clean windows'): a window of large shapes draws the card to its power cap, and the control
    interleaved with them, and timed again alone at once, runs at the capped clock (issue 50: an idle,
    dedicated H100 read 7.51 us against 6.50 us idle after large prefill shapes and raised GpuBusy). On an H100
    (benchmarks/busy_clocks.py) the control read 7.24 us at 1365 MHz right after 60 s of large GEMMs and
    6.03 us at 1980 MHz one second later; beside a neighbour running them it read 6.82-7.50 us at 1305-1455
    MHz throughout. The card's own state passes in a second, a neighbour's does not; the clock alone cannot
    tell them apart (the neighbour lowers it too), so it only ends the wait early and is named in the reason.
    A window whose control is idle again once the card settled is noisy, re-timed as any noisy one."""

    drift: float
    z: float = 3.0
    keep: int = 15
    clean: list[float] = field(default_factory=list)
    clock: Callable[[], float | None] | None = None  # the SM clock now, MHz (gpu_idle.sm_clock)
    clocks: list[float] = field(default_factory=list)  # the clock read after each clean window
    settle_s: float = 1.0  # the most a suspect window's repeat waits for the card to settle
    pause: Callable[[float], None] = time.sleep
    # new compute processes on the card since the race's start, named (gpu_idle.Watch.newcomers; its argument:
    # read now, a suspect window): busy whatever the control read
    crowd: Callable[[bool], str | None] | None = None

    def _read(self) -> float | None:
        return self.clock() if self.clock is not None else None

    @property
    def ref_mhz(self) -> float | None:
        return statistics.median(self.clocks[-self.keep:]) if self.clocks else None

    def settle(self) -> float | None:
        """Wait for the card to leave the window's power state: settle_s, or until its clock is back at the clean
        windows' (read every 0.1 s). The clock read last."""
        ref, waited, mhz = self.ref_mhz, 0.0, None
        while waited < self.settle_s:
            step = min(0.1, self.settle_s - waited) if ref else self.settle_s
            self.pause(step)
            waited += step
            mhz = self._read()
            if ref and mhz and mhz >= 0.98 * ref:
                break
        return mhz

    @property
    def base(self) -> float | None:
        return statistics.median(self.clean[-self.keep:]) if self.clean else None

    def limit(self) -> float:
        xs = self.clean[-self.keep:]
        if len(xs) < 3:
            return self.drift
        med = statistics.median(xs)
        spread = 1.4826 * statistics.median(abs(x - med) for x in xs) / med if med > 0 else 0.0
        return max(self.drift, self.z * spread)

    def over(self, control_s: float) -> str | None:
        base, lim = self.base, self.limit()
        if base is None or control_s <= base * (1 + lim):
            return None
        return (f"control kernel {control_s * 1e6:.2f} us vs {base * 1e6:.2f} us idle "
                f"(+{control_s / base - 1:.1%} > {lim:.0%})")

    def judge(self, control_s: float, repeat: Callable[[], float]) -> tuple[str, str | None]:
        """clean | noisy | busy, and why."""
        mhz = self._read()
        why = self.over(control_s)
        crowd = self.crowd(why is not None) if self.crowd is not None else None
        if crowd is not None:  # a neighbour named by the card itself: its window's times are not ours alone
            return "busy", crowd + (f"; {why}" if why else "")
        if why is None:
            self.clean.append(control_s)
            if mhz:
                self.clocks.append(mhz)
            return "clean", None
        if mhz:
            ref = self.ref_mhz
            why += f" at {mhz:.0f} MHz" + (f" (clean windows {ref:.0f} MHz)" if ref else "")
        after = self.settle()
        again = repeat()
        alone = f"timed again alone after the card settled {again * 1e6:.2f} us" + (f" at {after:.0f} MHz"
                                                                                   if after else "")
        if self.over(again) is None:  # the window's own power draw, or the control's own noise: not busy
            self.clean.append(control_s)  # part of the idle history (a busy window's is censored)
            return "noisy", f"{why}; {alone}: not busy"
        return "busy", f"{why}; {alone}"


class Timer:
    """Warm device time per call. On a GPU a CUDA graph of GRAPH_CALLS back-to-back calls is replayed, so
    Python launch overhead is not counted (AITER times device kernels with the profiler); eager calls are
    the fallback for a candidate that cannot be captured. Samples are recorded with events and read after
    one synchronise per batch, never one per sample. Every sample starts from a flushed L2 (outside the timed
    window), so a sample's time does not depend on how many other candidates are being interleaved. The
    round-robin order is shuffled on every pass: in a fixed order each candidate always follows the same
    neighbour, and whatever that neighbour leaves behind (clocks, power, dirty lines) became a steady bias of
    1-2% between candidates that run the very same kernel."""

    GRAPH_CALLS = 10
    EAGER_CALLS = 3  # a screen sample's calls: 3 launches of host time, not 10 (~36 us each for Triton)
    LEAD_CHUNK = 8  # eager samples enqueued behind one GPU sleep

    # a capture window whose control kernel runs this much slower than the idle baseline is suspect (a neighbour
    # on the GPU slowed the 1024^3 control 11-16% on the H200, the candidates 20-35%, issue 34), or 3x the
    # control's own spread across clean windows where that is wider (BusyCheck)
    BUSY_DRIFT = 0.10
    BUSY_REPEAT = 5  # samples of the control timed alone again when a window's control drifted

    def __init__(self, device: torch.device, seed: int = 0, llc_bytes: int | None = None,
                 busy_drift: float | None = None):
        self.cuda = device.type == "cuda"
        self.device = device
        self._scrub: torch.Tensor | None = None
        # one stream for every capture's warm-up call: a new torch.cuda.Stream() per capture walks the pool's 32
        # streams, and PyTorch keeps a cuBLAS workspace per (handle, stream) for the life of the process (ATen's
        # CublasHandlePool.cpp, cublas_handle_stream_to_workspace; 32 MiB on Hopper). 32 x 32 MiB fits what an
        # H100 process's first race held past its plan: 0.97 GiB against a bound of 0.16 (benchmarks/issue50_s20)
        self._side: torch.cuda.Stream | None = None
        self.llc_bytes = llc_bytes  # the last-level cache the scrub must evict (workers/identity.py)
        # the CPU is shared by design (a 2-core VM with other work): the check is off there unless asked for
        self.busy_drift = busy_drift if busy_drift is not None else (self.BUSY_DRIFT if self.cuda else None)
        # the CPU has no power cap to wait out (its busy check runs in tests alone)
        self.watch = gpu_idle.Watch(device)  # the device's compute processes (before a race and during)
        self.busy_check = (BusyCheck(self.busy_drift, clock=gpu_idle.sm_clock(device),
                                     settle_s=BusyCheck.settle_s if self.cuda else 0.0, crowd=self.watch.newcomers)
                           if self.busy_drift is not None else None)
        self._control: tuple[Callable[[], Any], int] | None = None
        self.on_window: Callable[[int, int], None] | None = None  # (window, attempt): tests plant neighbours
        self.on_busy: Callable[[str], None] | None = None
        self._order = random.Random(seed)
        self._cycles_per_s: float | None = None
        self.host_per_sample = 200e-6  # host seconds to enqueue one eager sample: learnt from each batch
        self.lead_factor = 2.0  # the lead's length over the expected enqueueing time; doubled when outrun
        self.outran = 0  # eager batches the GPU idled in (timed again on a longer lead)
        self.eager_batches = 0
        self.discarded_s = 0.0  # device seconds of those batches' samples

    def scrub_bytes(self) -> int:
        """Twice the last-level cache: the identity's (256 MiB Infinity Cache on MI300X/MI355X, which a 2x-L2
        scrub left warm), else the L2 torch reports (50 MiB on an H200)."""
        l2 = getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 0) if self.cuda else 0
        return 2 * (max(self.llc_bytes or 0, l2 or 0) or 64 << 20)

    def _flush(self) -> None:
        if self._scrub is None:
            self._scrub = torch.empty(self.scrub_bytes() // 4, dtype=torch.int32, device=self.device)
        self._scrub.zero_()

    # -- capture guard, control kernel ------------------------------------------------------------------

    def capture(self, fn: Callable[[], Any]) -> tuple[Callable[[], Any], int, Callable[[], Any]]:
        """A fresh capture of fn: (what one sample runs, calls it holds, what one guarded replay returns). The
        guarded replay poisons the output the replay should write (NaN), replays once and returns that output:
        a launch off the capture stream recorded nothing, leaves the poison and fails the check (issue 34)."""
        if self.cuda:
            got = self._graph(fn)
            if got is not None:
                g, out = got

                def guarded() -> Any:
                    if isinstance(out, torch.Tensor) and out.is_floating_point():
                        out.fill_(float("nan"))
                    g.replay()
                    torch.cuda.synchronize()
                    return out

                def replay(_g: Any = g, _fn: Callable[[], Any] = fn) -> None:  # fn (and what it reads) lives on
                    _g.replay()
                return replay, self.GRAPH_CALLS, guarded
        fn()

        def eager_guarded() -> Any:  # eager calls record nothing to lose: a later call's own output
            out = fn()
            self.sync()
            return out
        return fn, 1, eager_guarded

    def control(self) -> tuple[Callable[[], Any], int]:
        """A fixed kernel timed among the candidates of every capture window: its drift says the device is
        shared (a 1024^3 bf16 GEMM on a GPU, 640^3 fp32 on the CPU)."""
        if self._control is None:
            g = torch.Generator(device="cpu").manual_seed(7)
            n, dt = (1024, torch.bfloat16) if self.cuda else (640, torch.float32)  # longer than a CPU time slice
            x = torch.randn(n, n, generator=g).to(self.device, dt)
            rep = self.capture(lambda: x @ x)
            self._control = (rep[0], rep[1])
        return self._control

    @property
    def control_base(self) -> float | None:
        """The control kernel's idle baseline (seconds per call), None before any clean window."""
        return self.busy_check.base if self.busy_check else None

    def window_state(self, control_s: float) -> tuple[str, str | None]:
        """clean | noisy | busy, and why, for a window whose control median is control_s
        (BusyCheck.judge; the repeat times the control alone BUSY_REPEAT more times)."""
        if self.busy_check is None:
            return "clean", None
        def repeat() -> float:
            try:
                return statistics.median(self.sample([self.control()], self.BUSY_REPEAT)[0])
            except ReplayFailed as f:  # the control kernel itself: its own error, not a candidate's
                raise f.error from None
        return self.busy_check.judge(control_s, repeat)

    def replayable(self, fn: Callable[[], Any]) -> tuple[Callable[[], Any], int]:
        """What one sample runs, and how many calls it holds. Makes the first call (a kernel that raises
        raises here), then captures the graph once; every later sample only replays it."""
        if self.cuda:
            got = self._graph(fn)
            if got is not None:
                return got[0].replay, self.GRAPH_CALLS
        else:
            fn()
        return fn, 1

    def eager(self, fn: Callable[[], Any]) -> tuple[Callable[[], Any], int]:
        """The screen's sample: EAGER_CALLS back-to-back calls launched eagerly (a flushed-L2 first call, then
        warm ones, as in a graph sample). Capturing a graph costs ~1 ms of host time a candidate, most of a
        small shape's halving race when all ~59 were captured; `sample(lead=True)` keeps launch gaps out."""
        fn()  # the first call: a kernel that raises raises here
        if not self.cuda:
            return fn, 1

        def calls() -> None:
            for _ in range(self.EAGER_CALLS):
                fn()
        return calls, self.EAGER_CALLS

    def sample(self, replays: list[tuple[Callable[[], Any], int]], n: int, lead: bool = False) -> list[list[float]]:
        """n samples of each replay, round-robin in a fresh random order each pass; seconds per call. `lead`:
        eager replays, enqueued in chunks of LEAD_CHUNK samples, each behind a GPU sleep long enough for the
        host to enqueue the chunk, so each sample times queued kernels, not the host's launches (a Triton
        launch costs ~36 us of host time, 7x a decode GEMM; one long sleep for 59 samples did not do: the
        launch queue fills and the GPU catches up with the host). Where the GPU still idled between samples,
        the batch is timed once more on a longer lead."""
        order = [i for _ in range(n) for i in self._order.sample(range(len(replays)), len(replays))]
        if not self.cuda:
            out: list[list[float]] = [[] for _ in replays]
            for i in order:
                fn, calls = replays[i]
                t0 = time.perf_counter()
                _call(i, fn)
                out[i].append((time.perf_counter() - t0) / calls)
            return out
        if not lead:
            return self._batch(replays, order, False)[0]
        for attempt in range(2):
            out, idle = self._batch(replays, order, True)
            self.eager_batches += 1
            if not idle:
                self.lead_factor = max(1.5, self.lead_factor * 0.8)
                break
            self.outran += 1  # the GPU waited for the host: launch gaps are in these samples
            self.lead_factor = min(6.0, self.lead_factor * 2)
            if attempt == 0:  # time them again; what they cost is counted as spent
                self.discarded_s += sum(sum(ts) * c for ts, (_, c) in zip(out, replays))
        return out

    def _batch(self, replays: list[tuple[Callable[[], Any], int]], order: list[int], lead: bool
               ) -> tuple[list[list[float]], bool]:
        """One batch of samples: (seconds per call for each replay, whether the GPU idled between samples)."""
        out: list[list[float]] = [[] for _ in replays]
        marks: list[tuple[int, list[Any], int]] = []  # (replay, its three events, calls)
        gaps: list[tuple[tuple[Any, Any, float], list[tuple[int, list[Any], int]], float]] = []
        chunk = self.LEAD_CHUNK if lead else len(order)
        for lo in range(0, len(order), max(1, chunk)):
            held = self._hold(len(order[lo:lo + chunk])) if lead else None
            t0 = time.perf_counter()
            first = len(marks)
            for i in order[lo:lo + chunk]:
                fn, calls = replays[i]
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
                ev[0].record()
                self._flush()
                ev[1].record()
                try:
                    _call(i, fn)
                except ReplayFailed:
                    torch.cuda.synchronize()  # what was enqueued before it finishes; then the batch is lost
                    raise
                ev[2].record()
                marks.append((i, ev, calls))
            if held is not None:
                gaps.append((held, marks[first:], (time.perf_counter() - t0) / max(1, len(marks) - first)))
        torch.cuda.synchronize()
        for i, ev, calls in marks:
            out[i].append(ev[1].elapsed_time(ev[2]) / 1e3 / calls)
        idle = False
        for (start, end, asked), chunk_marks, per_sample in gaps:
            self.host_per_sample = per_sample
            slept = start.elapsed_time(end) / 1e3
            if slept < 0.8 * asked:  # the clock ran faster than calibrated: more cycles next time
                self._cycles_per_s = (self._cycles_per_s or 1e9) * asked / max(1e-6, slept)
            # a gap on the GPU between the lead's end and a sample, or between two samples of the chunk
            ends = [end] + [ev[2] for _, ev, _ in chunk_marks[:-1]]
            idle |= any(e.elapsed_time(ev[0]) > 0.02 for e, (_, ev, _) in zip(ends, chunk_marks))  # > 20 us
        return out, idle

    def _hold(self, samples: int) -> tuple[Any, Any, float]:
        """Enqueue a GPU sleep lead_factor x the host time `samples` eager samples are expected to take to
        enqueue: (its start and end events, the seconds asked for)."""
        if self._cycles_per_s is None:  # calibrate torch.cuda._sleep's cycles once, after a warm-up sleep
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(5_000_000)
            a.record()
            torch.cuda._sleep(5_000_000)
            b.record()
            torch.cuda.synchronize()
            self._cycles_per_s = 5_000_000 / max(1e-6, a.elapsed_time(b) / 1e3)
        secs = min(0.1, self.lead_factor * self.host_per_sample * samples + 2e-4)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(int(secs * self._cycles_per_s))
        b.record()
        return a, b, secs

    def ready(self) -> None:
        """What the timer keeps for the process, made before a race counts its peak (TorchBackend.tune): the
        scrub buffer and the control kernel's graph, and with it cuBLAS's workspaces on the warm-up and capture
        streams."""
        if self.cuda:
            self.control()
            if self._scrub is None:
                self._flush()

    def _graph(self, fn: Callable[[], Any]) -> Any:
        side = self._side = self._side or torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(self.GRAPH_CALLS):
                    out = fn()  # the last call's output: what the capture guard checks
            g.replay()  # also the warm-up replay
            torch.cuda.synchronize()
            return g, out
        except torch.OutOfMemoryError:  # no memory for the graph: a failed candidate, never timed eagerly instead
            torch.cuda.synchronize()
            raise
        except Exception:  # not capturable: time eagerly
            torch.cuda.synchronize()
            return None

    def once(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        """Wall seconds for one call including any compile, and its output."""
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - t0, out

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
