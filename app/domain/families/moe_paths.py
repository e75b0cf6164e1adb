"""The MoE op's paths as data (fused_moe -> fused_moe_ -> _fused_moe_impl, fhmoe_, the grouped gfx1250 entry):
the activation dtype it derives (MoeADtype), the calls it refuses or declines, and for a row found, the stages it
builds (MoeRoute) with the launchers they run (MoeLauncher). The ops themselves are in moe_ops.py."""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.domain.families.conditions import Cond, Conds, holds
from app.domain.families.gpus import GPU_FP8, gpu_fp8
from app.domain.families.ops import MissRaises, RowUse


def moe_holds(cells: dict[str, str], cond: Cond, gfx: str) -> bool:
    """holds, where GPU_FP8 in a value is the GPU's own fp8, plus "~" (re.match of the cell), "<" and ">" (an
    integer cell below / above the value, or the cell a value "$<column>" names)."""
    col, op, val = cond
    val = val.replace(GPU_FP8, gpu_fp8(gfx))
    if op in ("<", ">") and val.startswith("$"):  # issue 35 (w35b): a bound in another cell of the call (an
        val = str(cells.get(val[1:], "")).strip()  # environment variable the op reads)
    cell = str(cells.get(col, "") if cells.get(col) is not None else "").strip()
    if op == "~":
        return re.match(val, cell) is not None
    if op in ("<", ">"):
        try:
            n = float(cell)
        except ValueError:
            return False
        try:
            bound = int(val)
        except ValueError:
            return False  # a bound int() rejects: the op raises first (MoeOpPath.raises)
        return n < bound if op == "<" else n > bound
    return holds(cells, (col, op, val))


@dataclass(frozen=True)
class MoeADtype:
    """One branch of the MoE op's activation-dtype choice: where every `when` condition holds (moe_holds) of the
    call's cells (the captured shape after remaps, "gfx": get_gfx(), and the op arguments a capture does not
    carry, MoeOpPath.call_defaults), q_dtype_a becomes `to`: a dtype, "@w" (the weight's dtype) or GPU_FP8."""
    when: Conds
    to: str


@dataclass(frozen=True)
class MoeLauncher:
    """A stage launcher the MoE op's metadata may hold (the function a stage partial wraps): the keyword it takes
    the kernel name in ("" where it takes none and runs its own config), and the kernel names it runs (a regex,
    re.match): a name it is handed and does not run makes AITER raise at launch ('not find kernel'); a launcher
    without a name runs a row whose kernel name it matches."""
    name: str
    kernel_arg: str
    runs: str


# a stage of a route: one launcher, or the first (regex on the row's kernel name, launcher) that matches
MoeStage = str | tuple[tuple[str, str], ...] | None



@dataclass(frozen=True)
class MoeRoute:
    """One branch of the stage choice the MoE op makes for the row its lookup found (get_2stage_cfgs after its
    'using' line), first that fits: conditions (moe_holds) on the call's cells as looked up, the row's cells
    (kernelName1/2, run_1stage, ksplit) and "flydsl" ("True" where FlyDSL is importable); the launchers it builds
    for stage 1 and 2. own_names: the branch names kernels of its own (a heuristic), the row's are not run."""
    where: str  # AITER's file:line at ROCm/aiter e4048607a5
    when: Conds
    stage1: MoeStage
    stage2: MoeStage = None
    own_names: bool = False
    # issue 35 (w35b): the launchers a route with own_names builds (stage 1, stage 2), where a wrapper step checks them
    builds: tuple[str, ...] = ()


@dataclass(frozen=True)
class MoeOpPath:
    """What the MoE op (fused_moe -> fused_moe_ -> _fused_moe_impl) does to a call before and after its lookup, as
    data: the activation dtype it derives from the weight dtype, quant type, activation, gate mode, the raw
    token count and the GPU (a_dtype, first branch that fits; the captured q_dtype_a is what the lookup is keyed
    on only where the op derives it), the calls it refuses, and for a row found, the stages it builds (routes)
    with the launchers they run (launchers)."""
    where: str  # AITER's file:line of the derivation
    a_dtype: tuple[MoeADtype, ...]
    # op arguments a capture does not carry, as the op's signature defaults them (column, value)
    call_defaults: tuple[tuple[str, str], ...] = ()
    # the calls a capture cannot tell apart (op arguments it does not carry), the default call first: a captured
    # q_dtype_a is looked up as captured where one of them derives it (the first that does is the call made),
    # else as the default call derives it; a_dtype "" marks a call the op cannot make for these cells
    call_variants: tuple[tuple[tuple[str, str], ...], ...] = ((),)
    launchers: tuple[MoeLauncher, ...] = ()
    routes: tuple[MoeRoute, ...] = ()
    # functions of the op's module its stage dispatch calls that must be AITER's own where it is run (a stub's
    # answer would route every row)
    needs: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()  # AITER files the op's module imports those from (beside the lookup's)
    # calls the op refuses before its lookup, on the call's cells as a_dtype sees them (q_dtype_a derived) and
    # "flydsl" (True where FlyDSL is importable)
    raises: tuple[MissRaises, ...] = ()
    # the op calls get_gfx() (GPU_ARCHS) on every call, not only on a miss (fused_moe.py:799): a GPU_ARCHS
    # get_gfx() rejects makes every call raise
    calls_get_gfx: bool = False
    # calls the entry hands back to its caller's generic MoE (returns None) before or after its lookup: a miss
    # of this table (MissRaises.raises is the condition; "a_w" is "<q_dtype_a>/<q_dtype_w>")
    declines: tuple[MissRaises, ...] = ()
    declines_after: tuple[MissRaises, ...] = ()  # the same, after its lookup found a row
    # the calls whose lookup reads this family's table, on the call's cells (all hold); the others look up another
    # table (fhmoe.py:569-586: AITER_CONFIG_FHMOE for the DSV4 I384 contract only, else tuned_fmoe); empty: every call
    table_when: Conds = ()
    # before its own lookup the op asks for a row it runs at every padded token tier up to the call's token
    # (MissRaises: where, what it raises where one lacks), looked up with tier_cells in place of the call's
    tiers_cover: MissRaises | None = None
    tier_cells: tuple[tuple[str, str], ...] = ()
    # issue 35 (w35b): the serving environment's variables the op reads (their unset values are in call_defaults): a
    # capture's env sets them for its calls (engagement.check's env)
    env: tuple[str, ...] = ()
    # the stage launchers (stage 1, stage 2) the op's metadata transform accepts; any other route raises (why)
    stages: tuple[str, ...] = ()
    stages_raise: str = ""
    # issue 35 (w35b): the calls the metadata transform is applied to (conditions on the call's cells; empty: all)
    stages_when: Conds = ()
    # issue 35 (w35b): calls whose lookup reads another table (MissRaises.raises of the call's cells)
    other_table: tuple[MissRaises, ...] = ()

    def _derive(self, full: dict[str, str], gfx: str) -> str:
        for b in self.a_dtype:
            if all(moe_holds(full, c, gfx) for c in b.when):
                return full.get("q_dtype_w", "") if b.to == "@w" else gpu_fp8(gfx) if b.to == GPU_FP8 else b.to
        return full.get("q_dtype_a", "")

    def variant(self, cells: dict[str, str], gfx: str, arch: str | None = None) -> dict[str, str]:
        """The call a captured shape is taken to come from (call_variants). gfx: the device's (its fp8); arch:
        what get_gfx() answers (GPU_ARCHS' last entry), the "gfx" the conditions read (default gfx)."""
        return next(iter(self.variants_for(cells, gfx, arch)), dict(self.call_variants[0]))

    def variants_for(self, cells: dict[str, str], gfx: str, arch: str | None = None) -> list[dict[str, str]]:
        """issue 35 (w35b): every call of call_variants that derives the captured q_dtype_a, in order, among those
        the shape's own cells allow (a shape may say its call: its entry, its gate mode)."""
        base = dict(self.call_defaults) | dict(cells) | {"gfx": arch or gfx}
        return [dict(v) for v in self.call_variants if all(cells.get(k, x) == x for k, x in v)
                and self._derive(base | dict(v), gfx) == cells.get("q_dtype_a")]

    def _cells(self, cells: dict[str, str], gfx: str, flydsl: bool = True, arch: str | None = None) -> dict[str, str]:
        full = dict(self.call_defaults) | dict(cells) | self.variant(cells, gfx, arch) | {"gfx": arch or gfx,
                                                                                          "flydsl": str(flydsl)}
        return full | {"a_w": f"{full.get('q_dtype_a', '')}/{full.get('q_dtype_w', '')}"}

    def declined(self, cells: dict[str, str], gfx: str, after: bool = False) -> MissRaises | None:
        full = self._cells(cells, gfx)
        return next((r for r in (self.declines_after if after else self.declines) if r.raises(full)), None)

    def q_dtype_a(self, cells: dict[str, str], gfx: str, arch: str | None = None) -> str:
        """The activation dtype the lookup is keyed on for a captured call (call_variants)."""
        base = dict(self.call_defaults) | dict(cells) | {"gfx": arch or gfx}
        return self._derive(base | self.variant(cells, gfx, arch), gfx)

    def refuses(self, cells: dict[str, str], gfx: str, flydsl: bool, arch: str | None = None) -> MissRaises | None:
        full = self._cells(cells, gfx, flydsl, arch)
        return next((r for r in self.raises if r.raises(full)), None)

    def reads_table(self, cells: dict[str, str], gfx: str, arch: str | None = None) -> bool:
        full = self._cells(cells, gfx, True, arch)
        return all(moe_holds(full, c, gfx) for c in self.table_when) and not any(r.raises(full)
                                                                               for r in self.other_table)

    def launcher(self, name: str | None) -> MoeLauncher | None:
        return next((x for x in self.launchers if x.name == name), None)

    def row_use(self, cells: dict[str, str], row: dict[str, str], gfx: str, flydsl: bool,
                arch: str | None = None) -> tuple[str, str]:
        """(RowUse: "hit" | "default" | "fails", why) for the row the lookup found, as the op's routes run it."""
        full = self._row_cells(cells, row, gfx, flydsl, arch)
        route = next((r for r in self.routes if all(moe_holds(full, c, gfx) for c in r.when)), None)
        if self._stages_refuse(route, full, gfx):
            return "fails", self.stages_raise
        if route is None:
            return "hit", ""
        if route.own_names:
            return "default", f"the op runs kernels of its own heuristic here ({route.where}), not the row's"
        return self._stages_use(route, full)

    def _row_cells(self, cells: dict[str, str], row: dict[str, str], gfx: str, flydsl: bool,
                   arch: str | None) -> dict[str, str]:
        """The call's cells and the row's the routes read (a pandas NaN read back as "")."""
        full = self._cells(cells, gfx, flydsl, arch) | {c: _cell(row, c) for c in ("kernelName1", "kernelName2",
                                                                                   "ksplit")}
        # a row without run_1stage is 2-stage (cfg.get("run_1stage", False)); an empty cell is NaN, which is true
        full["run_1stage"] = _cell(row, "run_1stage") if "run_1stage" in row else "0"
        return full

    def _stages_refuse(self, route: MoeRoute | None, full: dict[str, str], gfx: str) -> bool:
        """The op's metadata transform (stages) checks this call's stages and the route builds others."""
        return bool(self.stages) and self.wraps_stages(full, gfx) and (
            route is None or (route.own_names and not route.builds) or self._picked(route, full) != self.stages)

    def _stages_use(self, route: MoeRoute, full: dict[str, str]) -> tuple[RowUse, str]:
        """What the route's stage launchers do with the row's kernel names: run them, fall back, or raise."""
        ran = []
        for stage, col in ((route.stage1, "kernelName1"), (route.stage2, "kernelName2")):
            name = full[col] if full[col] != "Null" else ""
            if stage is None or (col == "kernelName2" and not name):
                continue
            picked = _launcher_name(stage, name)
            la = self.launcher(picked)
            assert la is not None, picked
            if la.kernel_arg and name and not re.match(la.runs, name):
                return "fails", (f"the op hands {col} {name!r} to {picked} ({route.where}), which does not run it: "
                                 "AITER raises at launch (not find kernel)")
            ran.append(bool(name) and re.match(la.runs, name) is not None)
        if ran and all(ran):
            return "hit", ""
        return "default", f"the op's stages ({route.where}) do not run the row's kernels"

    def wraps_stages(self, full: dict[str, str], gfx: str) -> bool:
        """The op's metadata transform (stages) is applied to this call (stages_when)."""
        return all(moe_holds(full, c, gfx) for c in self.stages_when)

    def stages_raise_on_miss(self, cells: dict[str, str], gfx: str, flydsl: bool,
                             arch: str | None = None) -> str | None:
        """issue 35 (w35b): a call without a row gets the op's default stages (get_2stage_cfgs with no cfg: no
        kernel names, run_1stage off for per_1x32, fused_moe.py:2377-2402), which the metadata transform checks as
        it checks a row's: what it raises, or None."""
        if not self.stages or not self.wraps_stages(self._cells(cells, gfx, flydsl, arch), gfx):
            return None
        use, why = self.row_use(cells, {"kernelName1": "", "kernelName2": "", "run_1stage": "0", "ksplit": "0"},
                                gfx, flydsl, arch)
        return why if use == "fails" else None

    @staticmethod
    def _picked(route: MoeRoute, full: dict[str, str]) -> tuple[str, ...]:
        """The launchers a route builds for the row (a 1-stage route: stage 1 only; a route naming its own
        kernels: what it builds)."""
        if route.own_names:
            return route.builds
        out = []
        for stage, col in ((route.stage1, "kernelName1"), (route.stage2, "kernelName2")):
            name = full[col] if full[col] != "Null" else ""
            if stage is not None:
                out.append(_launcher_name(stage, name))
        return tuple(out)


def _cell(row: dict[str, str], col: str) -> str:
    return str(row.get(col) if row.get(col) is not None else "")


def _launcher_name(stage: str | tuple[tuple[str, str], ...], name: str) -> str:
    """The launcher a route's stage builds for a kernel name: its one launcher, or the first whose regex matches."""
    return stage if isinstance(stage, str) else next(la for rx, la in stage if re.match(rx, name))

