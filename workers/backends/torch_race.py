"""Portable backend: races real GEMM kernels through PyTorch (and Triton on a GPU) for bf16_gemm shapes.

Each candidate is checked against a float64 reference with AITER's error ratio (fraction of elements
failing isclose; a16w16 uses rtol=atol=5e-2 for 16-bit outputs), a shifted copy of the winner's output must
fail that same check (negative control), and timing is warm: device events on a GPU, perf_counter on the
CPU, median of the repeats. Rows are written in the lease's tuned header.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from workers.backends.base import Batch, Emit, ShapeResult, now_iso

_DTYPES = {"torch.bfloat16": torch.bfloat16, "torch.float16": torch.float16, "torch.float32": torch.float32}
ERR_MAX = 0.05  # AITER's GEMM --errRatio default


@dataclass
class Candidate:
    name: str
    libtype: str  # the tuned table's libtype column for this kind of kernel
    split_k: int
    fn: Callable[[], torch.Tensor]


def err_ratio(out: torch.Tensor, ref: torch.Tensor, out_dtype: torch.dtype) -> float:
    tol = 5e-2 if out_dtype in (torch.bfloat16, torch.float16) else 1e-2
    bad = ~torch.isclose(out.double(), ref, rtol=tol, atol=tol)
    return float(bad.sum().item()) / max(1, bad.numel())


def _split_k_cpu(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, parts: int,
                 out_dtype: torch.dtype) -> Callable[[], torch.Tensor]:
    k = a.shape[1]
    bounds = [round(i * k / parts) for i in range(parts + 1)]

    def run() -> torch.Tensor:
        acc = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float32, device=a.device)
        for lo, hi in zip(bounds, bounds[1:]):
            acc += (a[:, lo:hi] @ b[:, lo:hi].t()).float()
        if bias is not None:
            acc += bias.float()
        return acc.to(out_dtype)
    return run


def candidates(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype
               ) -> list[Candidate]:
    m, n = a.shape[0], b.shape[0]
    out = torch.empty(m, n, dtype=a.dtype, device=a.device)

    def linear() -> torch.Tensor:
        return torch.nn.functional.linear(a, b, bias).to(out_dtype)

    def addmm_out() -> torch.Tensor:
        if bias is None:
            torch.mm(a, b.t(), out=out)
        else:
            torch.addmm(bias, a, b.t(), out=out)
        return out.to(out_dtype)

    bt = b.t().contiguous()

    def mm_pretransposed() -> torch.Tensor:
        y = a @ bt
        return (y + bias if bias is not None else y).to(out_dtype)

    cands = [Candidate("torch_linear", "torch", 0, linear), Candidate("torch_addmm_out", "torch", 0, addmm_out),
             Candidate("torch_mm_bt_contig", "torch", 0, mm_pretransposed)]
    for parts in (2, 4):
        if a.shape[1] >= 64 * parts:
            cands.append(Candidate(f"torch_splitk{parts}_fp32acc", "torch", parts,
                                   _split_k_cpu(a, b, bias, parts, out_dtype)))
    if a.is_cuda:
        from workers.backends import triton_gemm
        cands += [Candidate(name, "triton", sk, fn) for name, sk, fn in triton_gemm.candidates(a, b, bias, out_dtype)]
    return cands


class Timer:
    """Warm device time per call. On a GPU a CUDA graph of GRAPH_CALLS back-to-back calls is replayed, so
    Python launch overhead is not counted (AITER times device kernels with the profiler); eager events are
    the fallback for a candidate that cannot be captured."""

    GRAPH_CALLS = 10

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def series(self, fn: Callable[[], Any], repeats: int, keep_going: Callable[[list[float]], bool]) -> list[float]:
        graph = self._graph(fn) if self.cuda else None
        times: list[float] = []
        for _ in range(repeats):
            if graph is not None:
                times.append(self.once(graph.replay) / self.GRAPH_CALLS)
            else:
                times.append(self.once(fn))
            if not keep_going(times):
                break
        return times

    def _graph(self, fn: Callable[[], Any]) -> Any:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(self.GRAPH_CALLS):
                    fn()
            g.replay()
            torch.cuda.synchronize()
            return g
        except Exception:  # not capturable: time eagerly
            torch.cuda.synchronize()
            return None

    def once(self, fn: Callable[[], Any]) -> float:
        """Seconds for one call, measured on the device."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


class TorchBackend:
    name = "torch"
    families = ["bf16_gemm"]

    def __init__(self, device: str = "cpu", warmup: int = 2, repeats: int = 15, candidate_limit_s: float = 10.0,
                 seed: int = 0, only: list[str] | None = None):
        self.device = torch.device(device)
        self.warmup, self.repeats, self.limit, self.seed = warmup, repeats, candidate_limit_s, seed
        self.only = only  # restrict to these candidate names (benchmarks, tests)
        self.timer = Timer(self.device)

    def run(self, batch: Batch, emit: Emit) -> None:
        for item in batch.lease["shapes"]:
            if batch.should_stop() or batch.time_left() <= 0:
                return  # the rest goes back to the queue when the agent releases the lease
            res = self.tune(batch, item)
            if res is None:  # stopped mid-shape: abandon it, the release re-queues it
                return
            emit(res)

    def _inputs(self, shape: dict[str, str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        m, n, k = int(shape["M"]), int(shape["N"]), int(shape["K"])
        dtype = _DTYPES[shape["dtype"]]
        g = torch.Generator(device="cpu").manual_seed(self.seed + m * 31 + n * 17 + k)
        a = torch.randn(m, k, generator=g).to(self.device, dtype)
        b = (torch.randn(n, k, generator=g) / k ** 0.5).to(self.device, dtype)
        bias = torch.randn(n, generator=g).to(self.device, dtype) if shape["bias"] == "True" else None
        return a, b, bias

    def _race_one(self, c: Candidate, ref: torch.Tensor, out_dtype: torch.dtype, batch: Batch
                  ) -> tuple[dict[str, Any], torch.Tensor | None]:
        try:
            first = self.timer.once(c.fn)  # includes any compile; bounds the candidate
            if first > self.limit:
                return {"name": c.name, "error": f"exceeded the {self.limit}s candidate limit ({first:.1f}s)"}, None
            out = c.fn()
            self.timer.sync()
            err = err_ratio(out, ref, out_dtype)
            for _ in range(self.warmup):
                c.fn()
            times = self.timer.series(c.fn, self.repeats, lambda ts: not (
                batch.should_stop() or sum(ts) > self.limit or batch.time_left() <= 0))
            return {"name": c.name, "us": statistics.median(times) * 1e6, "err_ratio": err,
                    "libtype": c.libtype, "splitK": c.split_k}, out
        except Exception as e:  # a kernel that raises is a failed candidate, never a winner
            return {"name": c.name, "error": f"{type(e).__name__}: {e}"[:500]}, None

    def tune(self, batch: Batch, item: dict[str, Any]) -> ShapeResult | None:
        t0, started = time.monotonic(), now_iso()
        shape = item["shape"]
        sid = item["shape_id"]
        unsupported = [f for f in ("scaleAB", "bpreshuffle") if shape.get(f) == "True"]
        if unsupported or shape.get("dtype") not in _DTYPES or shape.get("outdtype") not in _DTYPES:
            return ShapeResult(sid, "failed", error=f"torch backend cannot run {shape} ({unsupported or 'dtype'})",
                               elapsed_s=time.monotonic() - t0, started_at=started, finished_at=now_iso())
        a, b, bias = self._inputs(shape)
        out_dtype = _DTYPES[shape["outdtype"]]
        ref = a.double() @ b.double().t() + (bias.double() if bias is not None else 0)
        results, outs = [], {}
        for c in candidates(a, b, bias, out_dtype):
            if self.only and c.name not in self.only:
                continue
            if batch.should_stop():
                return None
            if results and batch.time_left() <= 0:
                break  # past the budget: the race ends with the candidates timed so far
            rec, out = self._race_one(c, ref, out_dtype, batch)
            results.append(rec)
            if out is not None:
                outs[c.name] = out
        return self._verdict(batch, item, results, outs, ref, out_dtype, t0, started)

    def _verdict(self, batch: Batch, item: dict[str, Any], results: list[dict], outs: dict, ref: torch.Tensor,
                 out_dtype: torch.dtype, t0: float, started: str) -> ShapeResult:
        sid, shape = item["shape_id"], item["shape"]
        ok = [r for r in results if "us" in r and r["err_ratio"] <= ERR_MAX]
        default = next((r.get("us") for r in results if r["name"] == "torch_linear"), None)
        cands = [{"name": r["name"], "us": r.get("us"), "err_ratio": r.get("err_ratio"), "error": r.get("error")}
                 for r in results]
        done = {"candidates": cands, "default_us": default, "started_at": started}
        if not ok:
            return ShapeResult(sid, "failed", error="no candidate passed the error check", **done,
                               elapsed_s=time.monotonic() - t0, finished_at=now_iso())
        win = min(ok, key=lambda r: r["us"])
        shifted = outs[win["name"]].double() + 0.5 * (1.0 + ref.abs())
        if err_ratio(shifted, ref, out_dtype) <= ERR_MAX:
            return ShapeResult(sid, "failed", error="negative control passed: the error check cannot see errors",
                               **done, elapsed_s=time.monotonic() - t0, finished_at=now_iso())
        row = self._row(batch.lease, shape, win)
        return ShapeResult(sid, "ok", row=row, us=win["us"], err_ratio=win["err_ratio"], kernel_name=win["name"],
                           **done, elapsed_s=time.monotonic() - t0, finished_at=now_iso())

    @staticmethod
    def _row(lease: dict[str, Any], shape: dict[str, str], win: dict[str, Any]) -> dict[str, str]:
        m, n, k = int(shape["M"]), int(shape["N"]), int(shape["K"])
        us = win["us"]
        elem = 4 if shape["dtype"] == "torch.float32" else 2
        vals = dict(shape, gfx=lease["gfx"], cu_num=str(lease["cu_num"]), libtype=win["libtype"], solidx="0",
                    splitK=str(win["splitK"]), us=f"{us:.4f}", kernelName=win["name"],
                    err_ratio=f"{win['err_ratio']:.4f}", tflops=f"{2 * m * n * k / us / 1e6:.2f}",
                    bw=f"{(m * k + n * k + m * n) * elem / us / 1e3:.2f}")
        return {c: vals.get(c, "") for c in lease["tuned_header"]}
