"""The torch race's candidates: the library paths (F.linear, the default, first of all; the pre-transposed
matmul; split-K in fp32) and, on a GPU, every Triton config (workers/backends/triton_gemm.py)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

_DTYPES = {"torch.bfloat16": torch.bfloat16, "torch.float16": torch.float16, "torch.float32": torch.float32}
DEFAULT = "torch_linear"  # F.linear: the library path an untuned shape takes
# placement "shift": a capture window's copy of an input lies at a random offset, a multiple of SHIFT_STEP bytes
# (the caching allocator's own alignment, so a kernel sees the alignment it always does), under SHIFT_BYTES
SHIFT_BYTES = 2 << 20
SHIFT_STEP = 512


@dataclass
class Candidate:
    name: str
    libtype: str  # the tuned table's libtype column for this kind of kernel
    split_k: int
    fn: Callable[[], torch.Tensor]
    nbytes: int = 0  # device bytes a captured graph of it holds (its buffers and two calls' outputs: torch_memory)
    release: Callable[[], None] = lambda: None  # frees the buffers it keeps between calls; the next call re-makes them


def graph_bytes(kept: int, per_call: int) -> int:
    """What a graph of GRAPH_CALLS calls holds: the buffers a candidate keeps, and its private pool, where one
    call's outputs and temporaries are freed and reused by the next (two calls' worth at once)."""
    return kept + 2 * per_call


def linear_bytes(mn: int, e_in: int, e_out: int) -> int:
    """What the default (F.linear) holds: an M x N output in the input dtype and one in the output dtype a call."""
    return graph_bytes(0, mn * (e_in + e_out))


def shifted(t: torch.Tensor, rng: random.Random) -> torch.Tensor:
    """A contiguous copy of t at a random offset into a buffer of its own. A plain clone need not move: the
    caching allocator may hand the block a window freed straight back to the next window's clone of the same
    size, so that every window's "fresh" copies lie at the same addresses (issue 50; benchmarks/linear_modes.py
    records them on a GPU)."""
    e = t.element_size()
    off = rng.randrange(SHIFT_BYTES // SHIFT_STEP) * SHIFT_STEP // e
    buf = torch.empty(t.numel() + SHIFT_BYTES // e, dtype=t.dtype, device=t.device)
    out = buf[off:off + t.numel()].view(t.shape)
    out.copy_(t)
    return out


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


MM_BT = "torch_mm_bt_contig"
SPLIT_PARTS = (2, 4)


def _split_name(parts: int) -> str:
    return f"torch_splitk{parts}_fp32acc"


def kernel_catalog() -> list[str]:
    """Every name candidates() may race, on any device (Triton's on a GPU): the image's kernel catalog for the
    torch backend's family, which the service holds posted winners to."""
    from workers.backends.triton_configs import CONFIGS, config_name
    return [DEFAULT, MM_BT, *map(_split_name, SPLIT_PARTS), *map(config_name, CONFIGS)]


def candidates(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype,
               place: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list[Candidate]:
    """The library paths first (the default first of all), then, on a GPU, every Triton config. Each library
    entry is a distinct call into BLAS. `torch.addmm(bias, a, b.t(), out=...)` is not one: F.linear on 2-D
    input already makes that very call (at::addmm with a bias, at::matmul -> mm without; torch's
    aten/src/ATen/native/Linear.cpp), so it raced the default's own kernel against itself and handed the race
    a 1-2% placement difference as a win (H200 runs of benchmarks/early_stop.py, which lists the kernels each
    library entry launches). `place`: how the pre-transposed weight is copied (shifted: a window's own placement)."""

    def linear() -> torch.Tensor:
        return torch.nn.functional.linear(a, b, bias).to(out_dtype)

    bt = place(b.t()) if place else b.t().contiguous()

    def mm_pretransposed() -> torch.Tensor:  # the weight stored K x N: the NN layout, another BLAS kernel
        y = a @ bt
        return (y + bias if bias is not None else y).to(out_dtype)

    mn, e_in, e_out = a.shape[0] * b.shape[0], a.element_size(), torch.empty(0, dtype=out_dtype).element_size()
    cands = [Candidate(DEFAULT, "torch", 0, linear, linear_bytes(mn, e_in, e_out)),
             Candidate(MM_BT, "torch", 0, mm_pretransposed, graph_bytes(0, mn * (2 * e_in + e_out)))]
    for parts in SPLIT_PARTS:
        if a.shape[1] >= 64 * parts:
            cands.append(Candidate(_split_name(parts), "torch", parts, _split_k_cpu(a, b, bias, parts, out_dtype),
                                   graph_bytes(0, mn * (4 + e_in + 4 + 4 + e_out))))  # acc, part, its float, out
    if a.is_cuda:
        from workers.backends import triton_gemm
        cands += [Candidate(name, "triton", sk, fn, graph_bytes(kept, per_call), release)
                  for name, sk, fn, kept, per_call, release in triton_gemm.candidates(a, b, bias, out_dtype)]
    return cands
