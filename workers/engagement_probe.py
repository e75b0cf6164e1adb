"""Call AITER's own table lookup for captured shapes: what `python -m workers.verify --engagement` runs inside
the served image (AITER imported for real), and what tests/differential runs on CPU (AITER's same files with
the hardware queries stubbed). A probe returns (hit, row) per shape; the row is the tuned row AITER uses.

Which AITER function a family is looked up with is the family's data (TableFamily.aiter_lookup); the
argument building here mirrors each op's caller (tuned_gemm.py:290-324, gemm_op_a8w8.py:646-679,
fused_moe.py:733-904), nothing more.
"""

from __future__ import annotations

import ctypes
import hashlib
import inspect
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable

Probe = Callable[[dict[str, str]], tuple[bool, dict | None]]


class Found(Exception):
    """Raised from fused_moe's '[fused_moe] using ... for {keys}' log line: the lookup is done, kernel set-up
    (which needs a GPU) follows."""

    def __init__(self, cfg: Any):
        self.cfg = cfg


class _StopAtUsing:
    """The module's logger, except that the 'using ... for {keys}' line ends the call with the cfg it found."""

    def __init__(self, inner: Any):
        self._inner = inner

    def info(self, msg, *a, **k):
        if str(msg).startswith("[fused_moe] using"):
            self._inner.info(msg, *a, **k)  # the line a server log carries
            raise Found(inspect.currentframe().f_back.f_locals.get("cfg"))
        return self._inner.info(msg, *a, **k)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _torch_dtype(name: str) -> Any:
    import torch
    return getattr(torch, name.removeprefix("torch."), name)


def bf16_probe(tuned_gemm: Any) -> Probe:
    fn = tuned_gemm.get_GEMM_A16W16_config
    params = inspect.signature(fn).parameters

    def probe(s):
        kw = dict(M=int(s["M"]), N=int(s["N"]), K=int(s["K"]), bias=s["bias"] == "True", dtype=s["dtype"],
                  otype=s["outdtype"], scaleAB=s["scaleAB"] == "True")
        if "bpreshuffle" in params:
            kw["bpreshuffle"] = s["bpreshuffle"] == "True"
        cfg = fn(**kw)
        return (cfg is not None and "us" in cfg), cfg  # a miss returns a default config, not a tuned row
    return probe


def a8w8_probe(gemm_op_a8w8: Any, tuned_file: str, cpp_kernel: Callable[[dict], Any] | None = None) -> Probe:
    """Python supplies splitK from its row; where the compiled table's kernel can be told (cpp_kernel), a hit
    also needs that kernel to be the row's."""
    if "get_GEMM_config_with_quant_type" in vars(gemm_op_a8w8):
        def look(s):
            return gemm_op_a8w8.get_GEMM_config_with_quant_type(int(s["M"]), int(s["N"]), int(s["K"]),
                                                                _torch_dtype(s["q_dtype_w"]), tuned_file)
    else:  # 0.1.7: keyed without q_dtype_w
        def look(s):
            return gemm_op_a8w8.get_CKGEMM_config(int(s["M"]), int(s["N"]), int(s["K"]), tuned_file)

    def probe(s):
        cfg = look(s)
        hit = cfg is not None
        if hit and cpp_kernel is not None:
            hit = cpp_kernel(s) == int(cfg["kernelId"])
        return hit, cfg
    return probe


def fmoe_probe(fused_moe: Any, ActivationType: Any, QuantType: Any, flydsl: bool) -> Probe:
    fn = fused_moe.get_2stage_cfgs
    params = list(inspect.signature(fn).parameters)
    fused_moe.__dict__["logger"] = _StopAtUsing(fused_moe.__dict__["logger"])

    def probe(s):
        q = getattr(QuantType, s["q_type"].split(".")[1])
        args = dict(token=fused_moe.get_padded_M(int(s["token"])), model_dim=int(s["model_dim"]),
                    inter_dim=int(s["inter_dim"]), expert=int(s["expert"]), topk=int(s["topk"]),
                    dtype=_torch_dtype(s["dtype"]), q_dtype_a=_torch_dtype(s["q_dtype_a"]),
                    q_dtype_w=_torch_dtype(s["q_dtype_w"]), q_type=fused_moe.quant_remap.get(q, q),
                    use_g1u1=bool(int(s["use_g1u1"])), activation=getattr(ActivationType, s["act_type"].split(".")[1]),
                    doweight_stage1=bool(int(s["doweight_stage1"])), hidden_pad=0, intermediate_pad=0)
        if "bias1" in params:
            args.update(bias1=None, bias2=None)
        try:
            fn(**args)
        except Found as f:
            cfg = f.cfg
        else:
            raise RuntimeError("fused_moe lookup ended without its 'using' log line")
        hit = cfg is not None
        if hit and not flydsl and any(str(cfg.get(c, "")).startswith("flydsl_") for c in ("kernelName1", "kernelName2")):
            hit = False  # the stage launcher has no FlyDSL to run it: AITER raises ('not find kernel')
        return hit, cfg
    return probe


def cpp_padding(csrc: Path) -> Callable[[int], int] | None:
    """The compiled a8w8 table's own M padding, cut verbatim out of rowwise_dispatch (ck_gemm_a8w8/gemm_a8w8.cu:
    nextPow2 and the `int padded_m = M; ...` block) and built with g++; None without g++ or the source."""
    path = csrc / "ck_gemm_a8w8" / "gemm_a8w8.cu"
    if not path.exists():
        return None
    text = path.read_text()
    pow2 = re.search(r"static constexpr int nextPow2\(unsigned int num\)\s*\{.*?\n\}", text, re.S)
    block = re.search(r"(int padded_m\s*=\s*M;.*?)\n\s*// Second check", text, re.S)
    if pow2 is None or block is None:
        return None
    src = ("#include <climits>\n" + pow2.group(0) + '\nextern "C" int cppPaddedM(int M) {\n'
           + block.group(1) + "\n  return padded_m;\n}\n")
    out = Path(tempfile.gettempdir()) / f"aiter_cpp_padding_{hashlib.sha256(src.encode()).hexdigest()[:12]}.so"
    if not out.exists():
        c = out.with_suffix(f".{os.getpid()}.cpp")
        c.write_text(src)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        try:
            subprocess.run(["g++", "-O1", "-shared", "-fPIC", str(c), "-o", str(tmp)], check=True,
                           capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return None
        os.replace(tmp, out)
    lib = ctypes.CDLL(str(out))
    lib.cppPaddedM.argtypes = [ctypes.c_int]
    lib.cppPaddedM.restype = ctypes.c_int
    return lib.cppPaddedM


def cpp_kernel_of(chip_info: Any, tuned_file: str, gfx: str, cu_num: int, padded: Callable[[int], int]
                  ) -> Callable[[dict], Any]:
    """Which kernelId the compiled a8w8 table runs: AITER's build_tune_dict over the resolved CSV (0.1.7: its
    gen_instances' plain cu_num-filtered (M,N,K) dict), then rowwise_dispatch's exact-then-padded find."""
    import pandas as pd
    df = pd.read_csv(tuned_file)

    class Ids(dict):
        def get(self, k, default=None):
            return int(k)
    build = vars(chip_info).get("build_tune_dict")
    if callable(build) and "gfx" in df.columns:
        table = build(df, {}, Ids())
        head: tuple = (gfx, cu_num)
    else:
        table = {(int(r["M"]), int(r["N"]), int(r["K"])): int(r["kernelId"])
                 for _, r in df.iterrows() if int(r["cu_num"]) == cu_num}
        head = ()

    def kernel(s):
        M, N, K = int(s["M"]), int(s["N"]), int(s["K"])
        for m in (M, padded(M)):
            if head + (m, N, K) in table:
                return table[head + (m, N, K)]
        return None
    return kernel


PROBES = {"get_GEMM_A16W16_config": "bf16", "get_GEMM_config_with_quant_type": "a8w8", "get_2stage_cfgs": "fmoe"}


def resolved_file(core: Any, attr: str) -> str:
    """The table path AITER resolved (current: an AITER_CONFIGS property; 0.1.7: a module constant)."""
    configs = vars(core).get("AITER_CONFIGS")
    return getattr(configs, attr) if configs is not None and hasattr(type(configs), attr) else vars(core)[attr]


def make_probe(family: Any, load: Callable[[str], Any], enums: Any, flydsl: bool, gfx: str, cu_num: int,
               csrc: Path | None, tuned_file: str) -> Probe:
    """load('aiter/x.py') -> that module of the AITER at hand; enums: where ActivationType/QuantType live."""
    path, fn = family.aiter_lookup.split(":")
    mod = load(path)
    kind = PROBES[fn]
    if kind == "bf16":
        return bf16_probe(mod)
    if kind == "fmoe":
        return fmoe_probe(mod, enums.ActivationType, enums.QuantType, flydsl)
    cpp = None
    pad = cpp_padding(csrc) if family.cpp_key is not None and csrc is not None else None
    if pad is not None:
        cpp = cpp_kernel_of(load("aiter/jit/utils/chip_info.py"), tuned_file, gfx, cu_num, pad)
    return a8w8_probe(mod, tuned_file, cpp)
