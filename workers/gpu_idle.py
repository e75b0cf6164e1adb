"""Is the GPU ours alone? The compute processes on a device, from the vendor's tool where there is one
(nvidia-smi, amd-smi, rocm-smi), else torch.cuda.list_gpu_processes (NVML through pynvml); and the card's SM
clock, which the race's busy check takes its control kernel's times at (sm_clock).

A container's tool may list processes by host PID: where this process's own PID is not among those listed
while it holds the device, the list cannot tell ours from another's before a race (`attributable` False); during
one, a PID not listed at its start is a newcomer all the same (Watch)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Processes:
    tool: str | None = None  # what listed them; None: nothing could
    pids: list[int] = field(default_factory=list)  # every compute process listed on the device
    attributable: bool = False  # our own PID is among them: the others are others

    @property
    def others(self) -> list[int]:
        return [p for p in self.pids if p != os.getpid()] if self.attributable else []

    def describe(self) -> str:
        return f"pids {self.others} ({self.tool})"


def _run(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _index(device: Any) -> int:
    return int(getattr(device, "index", None) or 0)


def list_processes(device: Any) -> Processes:
    """Compute processes on `device` (a torch.device); a CPU device has none to list."""
    if getattr(device, "type", "cpu") != "cuda":
        return Processes()
    import torch
    idx = _index(device)
    if torch.version.hip is None:
        out = _run(["nvidia-smi", "-i", str(idx), "--query-compute-apps=pid", "--format=csv,noheader"])
        if out is not None:
            return _own(Processes("nvidia-smi", [int(x) for x in re.findall(r"\d+", out)]))
    else:
        out = _run(["amd-smi", "process", "-g", str(idx), "--json"])
        if out is not None:
            return _own(Processes("amd-smi", [int(p) for p in re.findall(r'"pid"\s*:\s*(\d+)', out)]))
        out = _run(["rocm-smi", "--showpids", "--json"])
        if out is not None:
            try:
                pids = [int(k.split()[-1]) for k in json.loads(out).get("system", {}) if k.startswith("PID")]
            except (ValueError, AttributeError):
                pids = []
            return _own(Processes("rocm-smi", pids))
    try:
        text = torch.cuda.list_gpu_processes(idx)
    except Exception:  # no pynvml / amdsmi: nothing to list
        return Processes()
    return _own(Processes("torch.cuda.list_gpu_processes", [int(x) for x in re.findall(r"process\s+(\d+)", text)]))


def _own(p: Processes) -> Processes:
    p.attributable = os.getpid() in p.pids
    return p


@dataclass
class Watch:
    """Who else computes on the device, read at most every so often (nvidia-smi costs ~50 ms). Before a race
    (`look`): another attributable process refuses it. During one (`newcomers`): a PID the last look did not
    list is a process that started since. That is contention, read with no clock in it: the control kernel's
    time under a neighbour is also what the card's own power cap gives (an H100 read 6.82-7.50 us beside one
    and 7.24 us at the cap, idle 6.01; issue 50), and in a race's windows it read as idle beside one
    (benchmarks/issue50_s20). It needs no attributable PIDs either: a container's host PID
    not listed before is new all the same. A monitoring agent (nvidia-smi, DCGM) runs no compute process."""

    device: Any
    every_s: float = 1.0  # the most often a race reads the list (its windows between)
    seen: frozenset[int] | None = None  # the PIDs at the last look; None: no look yet, or nothing could list
    newcomer_pids: list[int] = field(default_factory=list)  # what the last read found
    at: float = -math.inf  # when the list was last read
    reads: int = 0  # what the reads cost, for the benchmarks: how many, and their seconds
    read_s: float = 0.0

    def due(self, every_s: float) -> bool:
        return time.monotonic() - self.at > every_s

    def _list(self) -> Processes:
        t = time.monotonic()
        p = list_processes(self.device)
        self.at = time.monotonic()
        self.reads, self.read_s = self.reads + 1, self.read_s + self.at - t
        return p

    def look(self) -> Processes:
        """The list now; what it shows becomes the race's starting set."""
        p = self._list()
        self.seen, self.newcomer_pids = (frozenset(p.pids) if p.tool else None), []
        return p

    def newcomers(self, now: bool = False) -> str | None:
        """The processes on the device the last look did not list, named; None where there are none, nothing
        could list them, or the list was read less than `every_s` ago (`now`: read it anyway). Once it found
        some, every call reads it again until they are gone: a window timed again right after a busy one is
        within the second, and a neighbour that stays must keep it busy (on an H100 the control kernel beside
        one read as idle, benchmarks/RESULTS.md)."""
        if self.seen is None or not (now or self.newcomer_pids or self.due(self.every_s)):
            return None
        p = self._list()
        self.newcomer_pids = sorted(set(p.pids) - self.seen - {os.getpid()})
        new = self.newcomer_pids
        return f"processes on {self.device} that started during the race: pids {new} ({p.tool})" if new else None


def sm_clock(device: Any) -> Callable[[], float | None] | None:
    """A reader of the device's SM clock now, in MHz (torch.cuda.clock_rate: NVML on NVIDIA, amdsmi on AMD), or
    None where it cannot be read (a CPU, no pynvml or amdsmi): the busy check then compares times alone."""
    if getattr(device, "type", "cpu") != "cuda":
        return None
    import torch
    try:
        torch.cuda.clock_rate(device)
    except Exception:  # no pynvml / amdsmi, or the library cannot reach the driver
        return None

    def read() -> float | None:
        try:
            return float(torch.cuda.clock_rate(device))
        except Exception:  # a reading that fails leaves the control's time as it is
            return None
    return read
