"""The condition AITER's rules are written in: (column, op, value) on a call's or a row's cells."""

from __future__ import annotations

import re
from typing import Literal

# the ops a condition may use: holds' ("<" and ">": moe_holds' only, a MoE call's cells)
CondOp = Literal["==", "!=", "in", "!in", "%", "~", "!~", "nonzero", "!int", "<", ">"]
# (column, op, value): see holds for the ops
Cond = tuple[str, CondOp, str]
Conds = tuple[Cond, ...]


def holds(cells: dict[str, str], cond: Cond) -> bool:
    """(column, op, value) on a row's or shape's cells: "==", "!=", "in" / "!in" (value '|'-separated), "%" (the cell
    is a multiple of value), "~" / "!~" (re.match), "nonzero" (pandas' truth of the cell: an empty cell is NaN, which
    is true)."""
    col, op, val = cond
    cell = str(cells.get(col, "")).strip()
    if op == "%":
        return cell.isdigit() and int(cell) % int(val) == 0
    if op in ("~", "!~"):  # the cell matches the regular expression value (re.match, as AITER parses names)
        return (re.match(val, cell) is not None) == (op == "~")
    if op == "nonzero":
        try:
            return float(cell) != 0 if cell else True
        except ValueError:
            return True
    if op == "!int":  # issue 35 (w35b): int() of the cell raises (an environment variable AITER int()s)
        try:
            int(cell)
            return False
        except ValueError:
            return True
    return {"==": cell == val, "!=": cell != val, "in": cell in val.split("|"), "!in": cell not in val.split("|")}[op]
