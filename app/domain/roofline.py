"""What a shape can cost at best on a device: peak matrix FLOP/s and memory bandwidth per gfx, as data.

Two uses, one model:
- `floor_us`: the fastest a call can possibly run (compute at peak, operands streamed at the last-level cache's
  bandwidth, since tuners time with warm caches). A result faster than this is not a measurement.
- `estimate_us`: what the default path probably costs before anything is measured (compute at peak, operands
  from HBM, plus a launch), used to rank shapes by served time.

Peaks are dense (no sparsity) spec-sheet figures for the full part, scaled by the reporting cu_num: a partition
or a cut-down part (fewer CUs/SMs) gets a proportionally lower peak, never a higher one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.domain.families import TableFamily


@dataclass(frozen=True)
class Device:
    units: int  # CUs (AMD) or SMs (NVIDIA) of the full part the peaks below are for
    tflops: dict[str, float]  # dense matrix TFLOP/s by precision
    hbm_tbs: float  # HBM bandwidth, TB/s
    cache_tbs: float  # last-level cache bandwidth, TB/s (upper bound on warm-cache operand streaming)
    launch_us: float = 4.0  # typical launch + tail of one kernel
    processor: str = "GPU"  # what the time a worker spends here is called ("CPU time" on a CPU identity)
    # how much slower than estimate_us a real default path may run (an untuned skinny shape, a busy part): a
    # default time past it is not a measurement (an inflated default makes any row look like a gain)
    slack: float = 1000.0


DEVICES: dict[str, Device] = {
    # MI300X: 304 CUs at 2.1 GHz; Infinity Cache 17.2 TB/s peak
    "gfx942": Device(304, {"bf16": 1307.4, "fp8": 2614.9, "fp4": 2614.9}, 5.3, 17.2),
    # MI355X: 256 CUs at 2.4 GHz (MI350X clocks lower, so this bounds both)
    "gfx950": Device(256, {"bf16": 2516.6, "fp8": 5033.2, "fp4": 10066.3}, 8.0, 17.2),
    # H200 (the portable torch backend's GPU): 132 SMs
    "sm_90": Device(132, {"bf16": 989.4, "fp8": 1978.9, "fp4": 1978.9}, 4.8, 12.0),
    # A CPU identity reports cores as cu_num: a generous 2 TFLOP/s per core bounds any x86/arm core today
    # (bf16 without native support runs at a few GFLOP/s a core; a Python call costs ~10 us: slack 100x more)
    "cpu": Device(1, {"bf16": 2.0, "fp8": 2.0, "fp4": 2.0}, 0.5, 2.0, launch_us=0.5, processor="CPU",
                  slack=100_000.0),
}
# An unknown gfx gets the fastest device we know, so a bound never refuses a real measurement (and a slack that
# covers a CPU's on top, for the ceiling)
_FASTEST = Device(1, {"bf16": 2516.6, "fp8": 5033.2, "fp4": 10066.3}, 8.0, 17.2, slack=1e7)
_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5}
_DTYPE_MATH = {"torch.float8_e4m3fnuz": "fp8", "torch.float8_e4m3fn": "fp8", "torch.int8": "fp8",
               "torch.float4_e2m1fn_x2": "fp4", "torch.int4": "fp4", "torch.uint8": "fp4"}


def _device(gfx: str, cu_num: int) -> tuple[Device, float]:
    dev = DEVICES.get(gfx)
    if dev is None:
        return _FASTEST, 1.0
    return dev, min(1.0, max(cu_num, 1) / dev.units) if dev.units > 1 else max(cu_num, 1)


def processor(gfx: str) -> str:
    """'CPU' or 'GPU': the word for a worker's time on this identity (an unknown gfx is a GPU)."""
    return DEVICES[gfx].processor if gfx in DEVICES else "GPU"


def _math(family: TableFamily, shape: dict[str, str]) -> str:
    return _DTYPE_MATH.get(shape.get("q_dtype_w", ""), family.math)


def _dims(shape: dict[str, str]) -> dict[str, int]:
    return {k: int(v) for k, v in shape.items() if isinstance(v, str) and v.isdigit()}


def work(family: TableFamily, shape: dict[str, str]) -> tuple[float, float]:
    """(FLOPs, operand bytes) of one call: A, B read once, C written once (MoE: tokens x topk rows, all
    experts' weights touched at most once)."""
    b = _BYTES[_math(family, shape)]
    mnk = [shape.get(c) for c in ("M", "N", "K", "B", "b")]
    if all(isinstance(v, str) and v.isdigit() for v in mnk[:3]):  # the GEMMs without a dict per shape (ingest)
        m, n, k = (int(v) for v in mnk[:3])  # type: ignore[arg-type]  # each a digit string: all() above
        batch = next((int(v) for v in mnk[3:] if isinstance(v, str) and v.isdigit()), 1)
        return 2.0 * batch * m * n * k, batch * ((m * k + n * k) * b + m * n * 2.0)
    g = _dims(shape)
    if {"M", "N", "K"} <= g.keys() or {"m", "n", "k"} <= g.keys():
        batch = g.get("B", g.get("b", 1))
        m, n, k = (g["M"], g["N"], g["K"]) if "M" in g else (g["m"], g["n"], g["k"])
        return 2.0 * batch * m * n * k, batch * ((m * k + n * k) * b + m * n * 2.0)
    if "token" in g:
        mats = 3 if g.get("use_g1u1", 1) else 2
        t, d, i = g["token"] * g["topk"], g["model_dim"], g["inter_dim"]
        experts = min(g["expert"], t)  # only routed experts' weights are read
        return 2.0 * t * d * i * mats, experts * d * i * mats * b + t * (d + i) * 2.0
    return float(math.prod(v for v in g.values() if v > 0) or 1), 0.0


def floor_us(family: TableFamily, shape: dict[str, str], gfx: str, cu_num: int) -> float:
    """No kernel on this device runs this call faster (warm caches, peak matrix rate)."""
    dev, scale = _device(gfx, cu_num)
    flops, nbytes = work(family, shape)
    peak = dev.tflops[_math(family, shape)] * 1e12 * scale
    return max(flops / peak, nbytes / (dev.cache_tbs * 1e12)) * 1e6


def estimate_us(family: TableFamily, shape: dict[str, str], gfx: str, cu_num: int) -> float:
    """A first guess at the default path's time, until one is measured: roofline from HBM plus a launch."""
    dev, scale = _device(gfx, cu_num)
    flops, nbytes = work(family, shape)
    peak = dev.tflops[_math(family, shape)] * 1e12 * scale
    return max(flops / peak, nbytes / (dev.hbm_tbs * 1e12)) * 1e6 + dev.launch_us


def ceiling_us(family: TableFamily, shape: dict[str, str], gfx: str, cu_num: int) -> float:
    """No default path on this device is slower than this: the estimate times the device's slack."""
    return estimate_us(family, shape, gfx, cu_num) * _device(gfx, cu_num)[0].slack
