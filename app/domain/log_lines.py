"""AITER's tuned-config hit and miss log lines, parsed back into shapes.

Format strings are AITER's own f-strings at ROCm/aiter e4048607a5: tuned_gemm.py:183/:232 (bf16),
ops/gemm_op_a8w8.py:483/:488 (blockscale), :542/:551 (a8w8, bpreshuffle), ops/gemm_op_a4w4.py:71/:76,
ops/batched_gemm_op_bf16.py:94/:102, ops/batched_gemm_op_a8w8.py:111/:119, fused_moe.py:2461-2463.
Hit lines need AITER_LOG_TUNED_CONFIG=1 before `import aiter`; miss lines are always logged (INFO).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from app.domain.families import family_for_file

_V = r"'?([\w.]+)'?"  # {dtype=} renders dtype='torch.bfloat16' for a str, torch.bfloat16 for a dtype
_BF16_HEAD = (rf"shape is M:(?P<M>\d+), N:(?P<N>\d+), K:(?P<K>\d+) dtype={_V} otype={_V} "
              r"bias=(?P<bias>\w+), scaleAB=(?P<scaleAB>\w+), bpreshuffle=(?P<bpreshuffle>\w+)")
_PAD = r"found padded_M: (?P<padded>\d+), N:\d+, K:\d+"

# (families the line may belong to, hit?, regex); families narrowed by the file named in the line
_PATTERNS: list[tuple[tuple[str, ...], bool, re.Pattern[str]]] = [
    (("bf16_gemm",), False, re.compile(_BF16_HEAD + r", not found tuned config in (?P<file>\S+), will use default")),
    (("bf16_gemm",), True, re.compile(_BF16_HEAD + rf" {_PAD} is tuned on cu_num = (?P<cu>\d+) in (?P<file>\S+), "
                                      r"libtype is (?P<libtype>\S+), kernel name is (?P<kernel>\S*)")),
    (("a8w8_gemm", "a8w8_bpreshuffle_gemm"), False, re.compile(
        r"shape is M:(?P<M>\d+), N:(?P<N>\d+), K:(?P<K>\d+), q_dtype_w:(?P<q_dtype_w>[\w.]+), "
        r"not found tuned config in (?P<file>\S+), will use default")),
    (("a8w8_gemm", "a8w8_bpreshuffle_gemm"), True, re.compile(
        rf"shape M:(?P<M>\d+), N:(?P<N>\d+), K:(?P<K>\d+) q_dtype_w:(?P<q_dtype_w>[\w.]+), {_PAD} is tuned, "
        r"in (?P<file>\S+?)!(?: libtype is (?P<libtype>\S+?)!)?(?: kernelName is (?P<kernel>\S+))?")),
    (("a8w8_blockscale_gemm", "a8w8_blockscale_bpreshuffle_gemm", "a4w4_blockscale_gemm"), False, re.compile(
        r"shape is M:(?P<M>\d+), N:(?P<N>\d+), K:(?P<K>\d+), not found tuned config in (?P<file>\S+), "
        r"will use default")),
    (("a8w8_blockscale_gemm", "a8w8_blockscale_bpreshuffle_gemm", "a4w4_blockscale_gemm"), True, re.compile(
        rf"shape is M:(?P<M>\d+), N:(?P<N>\d+), K:(?P<K>\d+), {_PAD} is tuned on cu_num = (?P<cu>\d+) in "
        r"(?P<file>\S+?) ?, kernel name is (?P<kernel>[^,!\s]+)")),
    (("bf16_batched_gemm",), False, re.compile(
        r"shape is B:(?P<B>\d+), M:(?P<M>\d+), N:(?P<N>\d+), K:(?P<K>\d+) dtype is bf16, not found tuned config")),
    (("bf16_batched_gemm",), True, re.compile(
        r"shape is B:(?P<B>\d+), M:(?P<M>\d+), N:(?P<N>\d+), K:(?P<K>\d+) dtype is bf16, is tuned on cu_num = "
        r"(?P<cu>\d+) in (?P<file>\S+), kernel name is (?P<kernel>[^,\s]+)")),
    (("a8w8_batched_gemm",), False, re.compile(
        r"shape is B:(?P<B>\d+), M:(?P<M>\d+), N:(?P<N>\d+), K:(?P<K>\d+), not found tuned config")),
    (("a8w8_batched_gemm",), True, re.compile(
        r"shape is B:(?P<B>\d+), M:(?P<M>\d+), N:(?P<N>\d+), K:(?P<K>\d+), is tuned on cu_num = (?P<cu>\d+) in "
        r"(?P<file>\S+), kernel name is (?P<kernel>[^,\s]+)")),
]
_FMOE = re.compile(r"\[fused_moe\] using (?:1stage|2stage)(?: xbf16)? (?P<cfg>default|\(kernelName1=.*?\)) "
                   r"for (?P<keys>\(.*\))")
_FMOE_COLS = ("gfx", "cu_num", "token", "model_dim", "inter_dim", "expert", "topk", "act_type", "dtype",
              "q_dtype_a", "q_dtype_w", "q_type", "use_g1u1", "doweight_stage1")
_FHMOE_EXTRA = ("shared_expert_id", "hidden_pad", "intermediate_pad", "gate_mode")
_MAX_KEYS_TEXT = 4096
_KERNEL1 = re.compile(r"kernelName1='([^']*)'")


@dataclass
class LogEvent:
    family: str
    shape: dict[str, str]  # shape columns as printed (raw M, not padded; MoE token is already padded)
    hit: bool
    file: str | None = None
    padded_m: int | None = None
    kernel: str | None = None
    gfx: str | None = None
    cu_num: int | None = None


@dataclass
class LogParse:
    events: list[LogEvent] = field(default_factory=list)
    lines: int = 0


def _families_for(candidates: tuple[str, ...], file: str | None) -> tuple[str, ...]:
    fam = family_for_file(file) if file and file.endswith(".csv") else None
    if fam is not None and fam.name in candidates:
        return (fam.name,)
    return candidates  # a single overlay path is used as-is, so its name need not say the family


def _tuple_items(text: str) -> list[str]:
    inner = text.strip()[1:-1]
    items, depth, cur = [], 0, ""
    for ch in inner:
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
        else:
            cur += ch
    items.append(cur.strip())
    out = []
    for it in items:
        m = re.fullmatch(r"<([\w.]+): -?\d+>", it)  # pybind enum repr inside a tuple
        out.append(m.group(1) if m else it.strip("'\""))
    return out


def _gemm_event(fams: tuple[str, ...], hit: bool, m: re.Match[str]) -> list[LogEvent]:
    g = {k: v for k, v in m.groupdict().items() if v is not None}
    shape = {k: g[k] for k in ("B", "M", "N", "K", "q_dtype_w", "bias", "scaleAB", "bpreshuffle") if k in g}
    if fams == ("bf16_gemm",):
        dtype, otype = m.group(4), m.group(5)
        shape["dtype"], shape["outdtype"] = dtype, (dtype if otype == "None" else otype)
    file = g.get("file")
    return [LogEvent(f, shape, hit, file, int(g["padded"]) if "padded" in g else None, g.get("kernel"),
                     cu_num=int(g["cu"]) if "cu" in g else None) for f in _families_for(fams, file)]


def _moe_event(m: re.Match[str]) -> LogEvent | None:
    if len(m.group("keys")) > _MAX_KEYS_TEXT:  # AITER prints ~300 characters; more is not its line
        return None
    items = _tuple_items(m.group("keys"))
    if len(items) not in (14, 18):
        return None
    cols = _FMOE_COLS + (_FHMOE_EXTRA if len(items) == 18 else ())
    cells = dict(zip(cols, items))
    hit = m.group("cfg") != "default"
    k1 = _KERNEL1.search(m.group("cfg"))
    shape = {c: v for c, v in cells.items() if c not in ("gfx", "cu_num")}
    return LogEvent("fhmoe" if len(items) == 18 else "fmoe", shape, hit, kernel=k1.group(1) if k1 else None,
                    gfx=cells["gfx"], cu_num=int(cells["cu_num"]) if cells["cu_num"].isdigit() else None)


def parse_log(text: str) -> LogParse:
    """Every AITER lookup line in a server log, whatever the family."""
    out = LogParse()
    for line in text.splitlines():
        if "fused_moe] using" in line:
            # one anchored match at the last marker: linear in the line (a search would retry the lazy
            # `.*?` from every marker and go quadratic on a hostile line)
            mo = _FMOE.match(line, line.rfind("[fused_moe] using"))
            ev = _moe_event(mo) if mo else None
            if ev:
                out.events.append(ev)
                out.lines += 1
            continue
        if "shape" not in line:
            continue
        for fams, hit, pat in _PATTERNS:
            mg = pat.search(line)
            if mg:
                out.events.extend(_gemm_event(fams, hit, mg))
                out.lines += 1
                break
    return out
