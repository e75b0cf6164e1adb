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


def _configs() -> list[tuple[int, int, int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages): small-M tiles with split-K for decode,
    square and wide tiles for prefill. Shared memory stays under Hopper's 228 KB per block."""
    out = []
    for bn, bk, sks in ((32, 128, (1, 2, 4, 8)), (64, 128, (1, 2, 4, 8)), (128, 128, (1, 2, 4)),
                        (64, 256, (1, 4)), (128, 64, (1, 2)), (256, 64, (1,))):
        out += [(16, bn, bk, sk, 4, 3 if bk == 256 else 4) for sk in sks]
    for bn, bk, sks in ((32, 128, (1, 4)), (64, 128, (1, 2, 4)), (128, 64, (1, 2, 4)), (256, 64, (1,))):
        out += [(32, bn, bk, sk, 4, 4) for sk in sks]
    out += [(64, 64, 64, sk, 4, 4) for sk in (1, 2, 4)] + [(64, 128, 64, sk, 4, 4) for sk in (1, 2, 4)]
    out += [(64, 128, 128, sk, 4, 3) for sk in (1, 2)] + [(64, 256, 64, 1, 8, 3), (64, 32, 128, 1, 4, 4)]
    out += [(128, 128, 64, sk, 8, 3) for sk in (1, 2, 4)] + [(128, 256, 64, sk, 8, 3) for sk in (1, 2)]
    out += [(128, 128, 32, 1, 4, 4), (128, 64, 64, 1, 4, 4), (128, 128, 64, 1, 4, 4), (128, 64, 64, 2, 4, 4)]
    out += [(256, 128, 64, 1, 8, 3), (256, 64, 64, 1, 4, 4), (256, 128, 64, 2, 8, 3)]
    out += [(16, 64, 64, 1, 2, 4), (16, 128, 64, 4, 4, 4), (32, 32, 64, 1, 4, 4), (32, 64, 64, 8, 4, 4),
            (64, 32, 64, 2, 4, 4), (64, 64, 128, 1, 4, 3), (64, 64, 128, 4, 4, 3), (128, 128, 128, 1, 8, 3)]
    return out


CONFIGS = _configs()


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
          cfg: tuple[int, ...]) -> Callable[[], torch.Tensor]:
    bm, bn, bk, sk, warps, stages = cfg
    m, k = a.shape
    n = b.shape[0]
    buf = torch.empty((sk, m, n), device=a.device, dtype=torch.float32 if sk > 1 else out_dtype)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), sk)
    bias_arg = bias if bias is not None else a
    k_per = triton.cdiv(triton.cdiv(k, sk), bk) * bk

    def run() -> torch.Tensor:
        _gemm_kernel[grid](a, b, buf, bias_arg, m, n, k, k_per, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                           buf.stride(0), buf.stride(1), buf.stride(2), HAS_BIAS=bias is not None, BLOCK_M=bm,
                           BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=warps, num_stages=stages)
        return buf[0] if sk == 1 else buf.sum(0).to(out_dtype)
    return run


def candidates(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype
               ) -> list[tuple[str, int, Callable[[], torch.Tensor]]]:
    out = []
    for cfg in CONFIGS:
        bm, bn, bk, sk, warps, stages = cfg
        if sk > 1 and a.shape[1] < bk * sk:
            continue  # a split shorter than one K tile does no work
        name = f"triton_gemm_{bm}x{bn}x{bk}_sk{sk}_w{warps}_s{stages}"
        out.append((name, sk, _make(a, b, bias, out_dtype, cfg)))
    return out
