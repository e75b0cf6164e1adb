"""The op model: what AITER's op does around its lookup, as data. The arguments it rewrites before the lookup
(OpRemap), the cells of the row it parses to run it (ReadCell), a default path that raises on a miss (MissRaises),
a miss looked up again at the weight's padded size (WeightRetry), the entry point a server calls and the probe calls
with meta tensors (OpEntry, OpArg), and the paths the op takes whatever the table holds (OpPath)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.domain.families.conditions import Cond, Conds, holds
from app.domain.families.gpus import GFX_NAMES, GPU_FP8, gpu_fp8

# how a ReadCell's cell is parsed; what an OpPath's op does
CellParse = Literal["int", "enum"]
PathRuns = Literal["raises", "default"]
# what the op does with the row its lookup returned: runs it, falls back to its default kernel, or raises
RowUse = Literal["hit", "default", "fails"]


@dataclass(frozen=True)
class OpRemap:
    """An argument the op rewrites before it calls its lookup, on the GPU it runs on: the column's value is kept
    where it is one of `keep` (GPU_FP8: the GPU's own fp8), else looked up as `to`."""
    where: str  # AITER's line, file:line at ROCm/aiter e4048607a5
    column: str
    keep: tuple[str, ...]
    to: str

    def value(self, cell: str, gfx: str) -> str:
        kept = {gpu_fp8(gfx) if k == GPU_FP8 else k for k in self.keep}
        return cell if cell in kept else self.to


@dataclass(frozen=True)
class ReadCell:
    """A cell of the row the op found, as AITER parses it when it runs the row: "int" (int() of what pandas read: an
    empty cell is NaN and int(NaN) raises, as does a word), "enum" (one of values: any other is a KeyError).
    Checked where every `when` condition (holds) is true of the row."""
    column: str
    parse: CellParse
    where: str  # AITER's file:line at ROCm/aiter e4048607a5
    values: tuple[str, ...] = ()
    when: Conds = ()

    def problem(self, row: dict[str, str]) -> str | None:
        if self.column not in row or not all(holds(row, c) for c in self.when):
            return None
        cell = str(row[self.column] if row[self.column] is not None else "").strip()
        if self.parse == "enum":
            return None if cell in self.values else (
                f"{cell!r} is not one AITER runs ({self.where}: one of {', '.join(self.values)})")
        try:
            ok = float(cell).is_integer()
        except ValueError:
            ok = False
        return None if ok else f"{cell!r} is not an integer, as AITER reads it ({self.where})"


@dataclass(frozen=True)
class MissRaises:
    """A shape the lookup finds no row for takes a default path that raises, where every `when` condition holds
    and not every `unless` one does: conditions (holds) on the shape's cells and "gfx" (the gfx the lookup keys
    on)."""
    where: str  # AITER's file:line at ROCm/aiter e4048607a5
    reason: str
    when: Conds = ()
    unless: Conds = ()

    def raises(self, cells: dict[str, str]) -> bool:
        return (all(holds(cells, c) for c in self.when)
                and not (self.unless and all(holds(cells, c) for c in self.unless)))


@dataclass(frozen=True)
class WeightRetry:
    """issue 35 (w35b): an op that looks a miss up again at its weight's size of a column, where the weight is padded
    past the activation's (gemm_a8w8_bpreshuffle: K, ops/gemm_op_a8w8.py:711-742), and raises where the weight's is
    smaller. A capture's shape has the activation's size only (AITER's log line prints it); `cell` names the weight's
    where a shape carries it, else the verdict of a miss that a padded weight could turn into a hit is unknown."""
    where: str  # AITER's file:line at ROCm/aiter e4048607a5
    column: str
    cell: str
    when: Conds = ()  # the calls of the op that does this (holds on the shape's cells)
    raises: str = ""  # what the op raises where the weight's is smaller

    def applies(self, shape: dict[str, str]) -> bool:
        return all(holds(shape, c) for c in self.when)

    def weight(self, shape: dict[str, str]) -> int | None:
        """The weight's size where the shape says it (an integer cell), else None."""
        cell = str(shape.get(self.cell) or "").strip()
        return int(cell) if cell.isdigit() else None


@dataclass(frozen=True)
class OpArg:
    """An argument the probe calls the op with, built from a shape: a meta tensor (nothing allocated) of `dims`
    (integer expressions over the shape's integer cells) and `dtype` ("torch.<name>", "dtypes.<name>": AITER's own
    dtypes module as the op module imports it, "@<column>": the dtype the shape's cell names), with `attrs`
    ((attribute, column): set to True where that cell is "True"); without dims, the dtype itself (an otype).
    keyword: passed by that name, else positionally; if_true: passed only where that column's cell is "True"."""
    dims: tuple[str, ...] = ()
    dtype: str = "torch.float32"
    keyword: str | None = None
    if_true: str | None = None
    attrs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class OpEntry:
    """The op a server calls for shapes of this family (the function vLLM/SGLang call, in the lookup's file), as the
    probe calls it: `args` from the shape, only its GPU kernel launchers replaced. launchers: (target, the row
    libtype that launcher runs, "*": any row); a target is a name in the op module ("F.linear": an attribute of
    one) or "package.module:name" (a module the op imports in its body). A call is a hit where the lookup returned
    a tuned row and the launcher reached runs that row's libtype; when: the shapes this op serves (holds), the
    first entry whose conditions hold is called."""
    function: str
    where: str  # AITER's file:line at ROCm/aiter e4048607a5
    args: tuple[OpArg, ...]
    launchers: tuple[tuple[str, str], ...]
    when: Conds = ()

    def serves(self, shape: dict[str, str]) -> bool:
        return all(holds(shape, c) for c in self.when)


@dataclass(frozen=True)
class OpPath:
    """A path the op takes whatever the table holds: it raises ("raises": an assert before its lookup or in the
    branch that runs the row) or runs its default kernel ("default"), where every `when` condition (holds) is true of
    the shape's cells and "gfx" (the GPU's: get_gfx_runtime), and every `row_when` one of the row the lookup found
    (none found: the rule does not apply); a value "@fp8" is the GPU's own fp8."""
    where: str  # AITER's file:line at ROCm/aiter e4048607a5
    reason: str
    runs: PathRuns = "raises"
    when: Conds = ()
    row_when: Conds = ()

    def applies(self, shape: dict[str, str], row: dict[str, str] | None, gfx: str, arch: str | None = None) -> bool:
        """arch: what get_gfx() answers (GPU_ARCHS' last entry, unstripped; default the GPU's), the "arch" cell a
        condition reads; a value "@gfx_names" is the archs get_gfx() accepts (GFX_NAMES)."""
        def at(cond: Cond) -> Cond:
            col, op, val = cond
            val = val.replace("@gfx_names", "|".join(sorted(GFX_NAMES)))
            return col, op, "|".join(gpu_fp8(gfx) if v == GPU_FP8 else v for v in val.split("|"))
        if self.row_when and row is None:
            return False
        cells = dict(shape, gfx=gfx, arch=arch if arch is not None else gfx)
        return (all(holds(cells, at(c)) if c[0] != "arch" else _arch_holds(cells["arch"], at(c)) for c in self.when)
                and all(holds(row or {}, at(c)) for c in self.row_when))


def _arch_holds(arch: str, cond: Cond) -> bool:
    """issue 35 (w35b): "in" / "!in" of get_gfx()'s answer as it is (unstripped: ' gfx950' is no arch)."""
    _, op, val = cond
    return (arch in val.split("|")) == (op == "in")

