"""The Triton GEMM configs the torch backend races on a GPU (workers/backends/triton_gemm.py), and their kernel
names; plain Python, so that a worker without Triton can list them too."""

from __future__ import annotations

Config = tuple[int, int, int, int, int, int]


def _configs() -> list[Config]:
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


def config_name(cfg: Config) -> str:
    bm, bn, bk, sk, warps, stages = cfg
    return f"triton_gemm_{bm}x{bn}x{bk}_sk{sk}_w{warps}_s{stages}"
