"""AITER's tuned-config hit and miss log lines, parsed back into shapes.

Which family logs which line, and each line's pattern (with AITER's file:line), is family data:
TableFamily.log_lines (app/domain/families.py). Here: reading a log with them, one pass, linear in its size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from app.domain.families import FAMILIES, LogLine, TableFamily, family_for_file

_MAX_KEYS_TEXT = 4096  # AITER prints ~300 characters of lookup key; more is not its line


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


def _grammar() -> list[tuple[LogLine, tuple[TableFamily, ...], re.Pattern[str]]]:
    """Each distinct line the families log, with the families that log it (in family order)."""
    by_line: dict[tuple[str, str, bool], tuple[LogLine, list[TableFamily]]] = {}
    for fam in FAMILIES.values():
        for ll in fam.log_lines:
            by_line.setdefault((ll.start, ll.pattern, ll.hit), (ll, []))[1].append(fam)
    return [(ll, tuple(fams), re.compile(ll.pattern)) for ll, fams in by_line.values()]


_GRAMMAR = _grammar()
_STARTS = tuple(dict.fromkeys(ll.start for ll, _, _ in _GRAMMAR))

def described() -> str:
    """What a reader looks for, in words (for a log that held none of it)."""
    return (f"AITER's tuned-config lookup lines, which start with {', '.join(repr(s) for s in _STARTS)} (a miss: "
            "'..., not found tuned config in ...'; a hit, only with AITER_LOG_TUNED_CONFIG=1 set on the server "
            "before `import aiter`: '... is tuned ...')")


_WORDS = tuple(dict.fromkeys(s.split()[0] for s in _STARTS))  # a line holding none of these is skipped at once


def _families_for(candidates: tuple[TableFamily, ...], file: str | None) -> tuple[TableFamily, ...]:
    fam = family_for_file(file) if file and file.endswith(".csv") else None
    if fam is not None and fam in candidates:
        return (fam,)
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


def _int(v: str | None) -> int | None:
    return int(v) if v is not None and v.isdigit() else None


def _events(ll: LogLine, fams: tuple[TableFamily, ...], m: re.Match[str]) -> list[LogEvent]:
    g = {k: v for k, v in m.groupdict().items() if v is not None}
    padded, kernel = _int(g.get("padded")), g.get("kernel")
    if "keys" in g:  # the lookup key tuple: the family whose key has as many items
        if len(g["keys"]) > _MAX_KEYS_TEXT:
            return []
        items = _tuple_items(g["keys"])
        fam = next((f for f in fams if len(f.key_columns) == len(items)), None)
        if fam is None:
            return []
        cells = dict(zip(fam.key_columns, items))
        shape = {c: v for c, v in cells.items() if c in fam.shape_columns}
        return [LogEvent(fam.name, shape, ll.hit, padded_m=padded, kernel=kernel, gfx=cells.get("gfx"),
                         cu_num=_int(cells.get("cu_num")))]
    file = g.get("file")
    out = []
    for fam in _families_for(fams, file):
        # a printed None is a cell the call did not give (bf16's otype=None): shape_defaults fill it
        shape = {c: v for c, v in g.items() if c in fam.shape_columns and v != "None"}
        out.append(LogEvent(fam.name, shape, ll.hit, file, padded, kernel, gfx=g.get("gfx"), cu_num=_int(g.get("cu"))))
    return out


def parse_log(text: str) -> LogParse:
    """Every AITER lookup line in a server log, whatever the family."""
    out = LogParse()
    for line in text.splitlines():
        if not any(w in line for w in _WORDS):
            continue
        # one anchored match at the last occurrence of each line's start: linear in the line (a search would retry
        # a lazy `.*?` from every marker and go quadratic on a hostile line)
        at = {s: line.rfind(s) for s in _STARTS}
        for ll, fams, pat in _GRAMMAR:
            pos = at[ll.start]
            mg = pat.match(line, pos) if pos >= 0 else None
            if mg:
                events = _events(ll, fams, mg)
                out.events.extend(events)
                out.lines += bool(events)
                break
    return out
