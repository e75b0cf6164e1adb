"""TableFamily: one AITER table family, its file and key, and its rules grouped by mechanism (rules.py)."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from app.domain.families.flat import FlatRules
from app.domain.families.ops import OpEntry, OpPath
from app.domain.families.renames import KernelRename
from app.domain.families.rules import CaptureRules, DeployRules, LoaderRules, LookupRules, OpDispatch, TunerRules


@dataclass(frozen=True)
class TableFamily(FlatRules):
    """A family's table as AITER names and keys it, and its rules; each rule also reads flat (family.padding,
    FlatRules) as it did before they were grouped."""
    name: str
    env_var: str
    tuned_file: str  # default table under aiter/configs/
    untuned_file: str
    tuned_header: tuple[str, ...]
    untuned_header: tuple[str, ...]
    key_columns: tuple[str, ...]  # what the runtime lookup indexes on
    shape_columns: tuple[str, ...]  # what a capture carries (the key less gfx and cu_num)
    m_column: str | None = "M"
    time_column: str | None = "us"
    err_columns: tuple[str, ...] = ("errRatio",)
    # the cells naming the kernel a row runs (joined by '+'): what an image upgrade's triage looks for in the new
    # image's kernel catalog, and what a confirmation race names its incumbent by (workers' kernel_name)
    kernel_columns: tuple[str, ...] = ("kernelName",)
    # kernels AITER renamed between releases without changing them (oldest first): an upgrade carries a row whose
    # kernel the new image has under its new name (app/domain/upgrade.py)
    kernel_renames: tuple[KernelRename, ...] = ()
    lookup: LookupRules = LookupRules()
    loader: LoaderRules = LoaderRules()
    op: OpDispatch = OpDispatch()
    deploy: DeployRules = DeployRules()
    tuner: TunerRules = TunerRules()
    capture: CaptureRules = CaptureRules()

    def remap(self, shape: dict[str, str]) -> dict[str, str]:
        """A captured shape as AITER looks it up (fused_moe.py:1310 quant_remap)."""
        out = dict(shape)
        for col, captured, used in self.op.remaps:
            if out.get(col) == captured:
                out[col] = used
        return out

    def looked_up(self, shape: dict[str, str], gfx: str, arch: str | None = None) -> dict[str, str]:
        """A captured shape as the op on this GPU (get_gfx_runtime) hands it to the lookup: remap, then op_remaps."""
        out = self.remap(shape)
        for r in self.op.op_remaps:
            if r.column in out:
                out[r.column] = r.value(out[r.column], gfx)
        if self.op.moe_op is not None and "q_dtype_a" in out:  # the op derives the activation dtype itself
            out["q_dtype_a"] = self.op.moe_op.q_dtype_a(out, gfx, arch)  # arch: get_gfx() (GPU_ARCHS)
        return out

    def op_path(self, shape: dict[str, str], row: dict[str, str] | None, gfx: str,
                arch: str | None = None) -> OpPath | None:
        """The first op_paths rule this call (the shape as captured, the row found, the GPU's gfx, get_gfx()'s
        answer) takes."""
        return next((r for r in self.op.op_paths if r.applies(shape, row, gfx, arch)), None)

    def op_entry(self, shape: dict[str, str]) -> OpEntry | None:
        """The op a server calls for this shape (op_entries, first that serves it)."""
        return next((e for e in self.op.op_entries if e.serves(shape)), None)

    def flydsl_known(self, row: dict[str, str]) -> bool:
        """The FlyDSL catalog has the row's kernel (flydsl_catalog: the whole name, as AITER's parser fullmatches
        it; the name pandas read, so an empty cell is no name)."""
        catalog = self.lookup.flydsl_catalog
        return catalog is None or any(re.fullmatch(catalog, str(row.get(c) or "")) is not None
                                      for c in self.kernel_columns)

    def other_op(self, shape: dict[str, str]) -> bool:
        """The shape is served by another op that reads this table without a libtype switch."""
        return any(shape.get(c) == v for c, v in self.op.libtype_use_unless)

    def unreadable(self, row: dict[str, str]) -> tuple[str, str] | None:
        """The first cell AITER could not parse when it runs this row, and why (read_cells)."""
        for rc in self.op.read_cells:
            why = rc.problem(row)
            if why is not None:
                return rc.column, why
        return None

    def unfilled(self, row: dict[str, str]) -> list[str]:
        exempt = {c for c, when, val in self.deploy.filled_unless if str(row.get(when, "")).strip() == val}
        return [c for c in self.deploy.filled if c not in exempt and c in row and not str(row.get(c, "")).strip()]

    def kernel_forms(self, name: str, row: Mapping[str, object] | None = None) -> list[str]:
        """One kernel's names, as written and as each later release names it (kernel_renames, applied in order;
        row: the table row naming it, for a rename that writes the row's cells into the name)."""
        out = [name]
        for rule in self.kernel_renames:
            renamed = rule.apply(out[-1], row)
            if renamed != out[-1]:
                out.append(renamed)
        return out

    def catalog_name(self, kernel: str, catalog: Collection[str] | None,
                     row: Mapping[str, object] | None = None) -> str:
        """A kernel (fmoe's: parts joined by '+') as the image's catalog names it: each part's newest form the
        catalog has (the name unchanged where it has none, or where no catalog is known); row: the row naming it."""
        if catalog is None or not kernel:
            return kernel
        parts = []
        for part in kernel.split("+"):
            forms = self.kernel_forms(part, row)
            parts.append(next((f for f in reversed(forms) if f in catalog), part))
        return "+".join(parts)

    def kernel_of(self, row: dict[str, str]) -> str:
        return "+".join(str(row[c]) for c in self.kernel_columns if str(row.get(c) or "").strip())

    @property
    def merge_name(self) -> str:
        """The substring AITER globs model_configs/ with (core.py get_config_file)."""
        return self.tuned_file.removesuffix(".csv")
