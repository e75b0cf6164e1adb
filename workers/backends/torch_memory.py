"""Device memory one torch race may hold (issue 50): the room this process has on the device (free memory and its
own cached blocks, under an optional cap: a worker in a served container shares the GPU with the server), what a
shape holds whatever is raced (the inputs, a capture window's fresh copies, the float64 reference), and the
groups the candidates are timed in so that no more of them are held at once than the room allows. A shape whose
fixed part does not fit is not raced (a failed shape with the reason); a candidate too large alone is a failed
candidate. On the CPU the room is unbounded unless a cap is set."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

GIB = 1 << 30


class Sized(Protocol):
    @property
    def nbytes(self) -> int: ...


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


@dataclass
class Plan:
    """One shape's memory plan: its fixed bytes, the room for its candidates, and the bound stated up front."""

    fixed: int
    room: float  # bytes free for the race before it starts (inf: unbounded)
    budget: float  # bytes the candidates held at once may take: room - fixed - MARGIN
    bound: int = 0  # fixed + the largest group of candidates held at once, as planned
    spread: bool = False  # the race's candidates do not fit at once: each group is freed before the next is made

    def record(self) -> dict[str, float | None]:
        return {"fixed_gib": self.fixed / GIB, "room_gib": None if math.isinf(self.room) else self.room / GIB,
                "bound_gib": self.bound / GIB}


class RaceMemory:
    MARGIN = 512 << 20  # left free beyond the plan: the control kernel, the L2 scrub, the allocator's rounding
    # float64 M x N arrays alive at once while an output is checked: the reference, and in negative_controls the
    # output, its two corrupted copies and check_output's differences and masks over them (torch_checks)
    CHECK_ARRAYS = 8

    def __init__(self, device: torch.device, cap_bytes: int | None = None) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.cap = cap_bytes

    def room(self) -> float:
        """Bytes this process may still allocate: the device's free memory and its own cached blocks, under the
        cap (counted from what it has allocated now)."""
        alloc = torch.cuda.memory_allocated(self.device) if self.cuda else 0
        room = math.inf
        if self.cuda:
            free, _ = torch.cuda.mem_get_info(self.device)
            room = free + torch.cuda.memory_reserved(self.device) - alloc
        return min(room, self.cap - alloc) if self.cap is not None else room

    @staticmethod
    def fixed(m: int, n: int, k: int, elem: int, bias: bool, pad: int = 0) -> int:
        """What a shape's race holds whatever is raced: its inputs and the pre-transposed weight, as many again
        (and `pad`: their shifted placement) for a capture window's fresh copies, and the float64 reference with
        the checks' float64 temporaries (or its operands while it is made, the larger)."""
        inputs = (m * k + 2 * n * k + (n if bias else 0)) * elem
        return 2 * inputs + pad + max(RaceMemory.CHECK_ARRAYS * m * n, m * n + m * k + n * k) * 8

    def plan(self, m: int, n: int, k: int, elem: int, bias: bool, pad: int = 0) -> Plan:
        fixed, room = self.fixed(m, n, k, elem, bias, pad), self.room()
        return Plan(fixed, room, room - fixed - self.MARGIN)

    @staticmethod
    def groups(items: Sequence[Sized], budget: float) -> list[list[Sized]]:
        """The items in order, in consecutive groups whose bytes fit the budget (one item at least in each)."""
        out: list[list[Sized]] = [[]]
        held = 0
        for x in items:
            if out[-1] and held + x.nbytes > budget:
                out.append([])
                held = 0
            out[-1].append(x)
            held += x.nbytes
        return [g for g in out if g]

    def peak_start(self) -> int:
        """Start counting a race's peak: the bytes held now (0 on the CPU)."""
        if not self.cuda:
            return 0
        torch.cuda.reset_peak_memory_stats(self.device)
        return torch.cuda.memory_allocated(self.device)

    def peak_gib(self, base: int) -> float | None:
        """The most the race held on the device beyond what was held at peak_start (None on the CPU)."""
        return (torch.cuda.max_memory_allocated(self.device) - base) / GIB if self.cuda else None

    def recover(self) -> None:
        """After an out-of-memory: the cached blocks go back, so that the next try sees the device as it is."""
        if self.cuda:
            torch.cuda.empty_cache()
