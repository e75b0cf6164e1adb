"""Triton GEMM candidates for the torch backend on a GPU: y = a @ b.T (+ bias), many tiles and split-K.

Split-K writes fp32 partials and sums them; the sum is part of the timed candidate. M is not specialised
(`do_not_specialize`), so each config compiles once per process and dtype/bias, not once per M: N and K keep
Triton's divisibility specialisation, which the vectorised loads and stores need.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

# the configs and their names live apart, so a worker without Triton reports them in its image's kernel catalog
from workers.backends.triton_configs import CONFIGS, config_name


@triton.jit(do_not_specialize=["M"])
def _gemm_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, K_PER, stride_am, stride_ak, stride_bn, stride_bk,
                 stride_cs, stride_cm, stride_cn, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_per = K_PER  # a multiple of BLOCK_K, so each split starts aligned and loads stay vectorised
    k_lo = tl.multiple_of(pid_k * k_per, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_per, BLOCK_K):
        rk = k_lo + k0 + tl.arange(0, BLOCK_K)
        kmask = (rk < K) & (rk < k_lo + k_per)
        a = tl.load(a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & kmask[None, :], other=0.0)
        b = tl.load(b_ptr + rn[None, :] * stride_bn + rk[:, None] * stride_bk,
                    mask=(rn[None, :] < N) & kmask[:, None], other=0.0)
        acc += tl.dot(a, b)
    if HAS_BIAS:
        if pid_k == 0:
            acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    c = c_ptr + pid_k * stride_cs + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def _make(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype,
          cfg: tuple[int, ...]) -> tuple[Callable[[], torch.Tensor], int, int, Callable[[], None]]:
    """(the call, the bytes its buffer keeps, the bytes one call allocates, what frees the buffer). The split-K
    buffer (sk x M x N fp32) is made on the first call, not here: made up front, every config's buffer of a
    shape lived through its whole race (32 GiB at M=6144 N=12288, twice over with a capture window's fresh
    set: the H100 ran out of memory, issue 50)."""
    bm, bn, bk, sk, warps, stages = cfg
    m, k = a.shape
    n = b.shape[0]
    dtype = torch.float32 if sk > 1 else out_dtype
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), sk)
    bias_arg = bias if bias is not None else a
    k_per = triton.cdiv(triton.cdiv(k, sk), bk) * bk
    held: list[torch.Tensor] = []

    def run() -> torch.Tensor:
        if not held:
            held.append(torch.empty((sk, m, n), device=a.device, dtype=dtype))
        buf = held[0]
        _gemm_kernel[grid](a, b, buf, bias_arg, m, n, k, k_per, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                           buf.stride(0), buf.stride(1), buf.stride(2), HAS_BIAS=bias is not None, BLOCK_M=bm,
                           BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=warps, num_stages=stages)
        return buf[0] if sk == 1 else buf.sum(0).to(out_dtype)
    e_out = torch.empty(0, dtype=out_dtype).element_size()
    kept = sk * m * n * torch.empty(0, dtype=dtype).element_size()
    return run, kept, (m * n * (4 + e_out) if sk > 1 else 0), held.clear


def candidates(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype
               ) -> list[tuple[str, int, Callable[[], torch.Tensor], int, int, Callable[[], None]]]:
    """(name, split-K, the call, bytes kept, bytes a call allocates, release) for every config."""
    out = []
    for cfg in CONFIGS:
        bk, sk = cfg[2], cfg[3]
        if sk > 1 and a.shape[1] < bk * sk:
            continue  # a split shorter than one K tile does no work
        out.append((config_name(cfg), sk, *_make(a, b, bias, out_dtype, cfg)))
    return out
