"""AITER releases: each one's table machinery (its ':'-merge, the file it reads when the env var is unset) and the
family rules that differ from the current release's, as typed functions of the current family."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from app.domain.families.catalog import get_family
from app.domain.families.gemm_ops import A4W4_OP, A4W4_XW, MNK_FILE, tensor
from app.domain.families.moe_ops import FMOE_OP_0_1_7
from app.domain.families.ops import OpPath, ReadCell
from app.domain.families.record import TableFamily

# what the merge does with a repeated key: raise (the current release's rewrite check) or keep the lowest us
MergeOnDuplicate = Literal["raise_rewrite", "lowest_us"]
# a release's change to one family: the current family in, the release's out (dataclasses.replace of its records)
FamilyOverride = Callable[[TableFamily], TableFamily]


@dataclass(frozen=True)
class AiterRelease:
    """One AITER release's table machinery: its ':'-merge (aiter/jit/core.py update_config_files), the file it
    reads when the env var is unset, and the family rules that differ from the current release's."""
    name: str
    version_prefixes: tuple[str, ...]
    # merge: union of columns with fills (current core.py:289-308) or identical columns asserted (0.1.7 :87-89)
    merge_union_columns: bool = True
    merge_dedup_extra: tuple[str, ...] = ("cu_num", "gfx")  # added to the untuned header (current :320-338)
    merge_dedup_tag: bool = True  # _tag joins the dedup key when present
    merge_on_duplicate: MergeOnDuplicate = "raise_rewrite"  # "lowest_us": silently keep the lowest us (0.1.7 :105-109)
    merge_first_must_exist: bool = False  # 0.1.7 reads the first path without an existence check (:82)
    merge_sorted_by_us: bool = False  # 0.1.7's merged file comes out sorted by us
    model_configs_suffix: str = ".csv"  # the model_configs glob: *<merge name>*<suffix>
    default_files: tuple[tuple[str, str], ...] = ()  # (family, default file name) when not family.tuned_file
    no_untuned_file: tuple[str, ...] = ("a8w8_blockscale_mxscale_batched_gemm",)  # merged without any dedup
    # families whose op calls the Python lookup only to log it: the compiled table alone picks the kernel
    lookup_unused: tuple[str, ...] = ()
    overrides: tuple[tuple[str, FamilyOverride], ...] = ()  # (family, its rules in this release)

    def family(self, name: str) -> TableFamily:
        fam = get_family(name)
        override = dict(self.overrides).get(name)
        return fam if override is None else override(fam)

    def merge_key(self, untuned_header: tuple[str, ...], header: tuple[str, ...]) -> tuple[str, ...]:
        """The merge's dedup key for a merged header: the image's untuned header (+ cu_num, gfx and _tag in the
        current release), as far as the merged table has them (core.py:320-338)."""
        keys = list(untuned_header)
        for extra in self.merge_dedup_extra + (("_tag",) if self.merge_dedup_tag else ()):
            if extra not in keys:
                keys.append(extra)
        return tuple(k for k in keys if k in header)

    def default_file(self, family: TableFamily) -> str:
        return dict(self.default_files).get(family.name, family.tuned_file)


# --- amd-aiter 0.1.7.post2 (Nov 2025): jit/core.py, tuned_gemm.py, ops/gemm_op_a8w8.py, fused_moe.py of that wheel

def _bf16_gemm_0_1_7(f: TableFamily) -> TableFamily:
    """No FlyDSL check in its lookup, no bpreshuffle (nor its no-solution assert); its solMap is a list of four
    (tuned_gemm.py:42: .index(libtype) at :173 raises ValueError on any other)."""
    return replace(f, lookup=replace(f.lookup, gfx_source="runtime", flydsl_miss="ignored", miss_raises=()),
                   op=replace(f.op, op_paths=(), read_cells=(
                       ReadCell("libtype", "enum", "tuned_gemm.py:173", ("torch", "hipblaslt", "skinny", "asm")),
                       ReadCell("solidx", "enum", "tuned_gemm.py:194-213", ("0", "1", "2"),
                                when=(("libtype", "==", "skinny"),)))))


def _a8w8_gemm_0_1_7(f: TableFamily) -> TableFamily:
    """csrc/ck_gemm_a8w8: gen_instances keeps the device's cu_num rows, gemm_a8w8.cu finds {M, N, K}; Python keys
    without q_dtype_w (ops/gemm_op_a8w8.py:211-242), its gemm_a8w8_CK (:353-376) remaps no dtype."""
    return replace(f, lookup=replace(f.lookup, cpp_key=("M", "N", "K"), aiter_args=MNK_FILE,
                                     aiter_lookup="aiter/ops/gemm_op_a8w8.py:get_CKGEMM_config"),
                   op=replace(f.op, op_remaps=()))


def _batched_gemm_0_1_7(f: TableFamily) -> TableFamily:
    """Batched: tables without gfx; the compiled table is taken to key {B, M, N, K} over the device's cu_num rows as
    a8w8's does (its .cu is not in what the tests unpack from the wheel: modelled, not executed)."""
    return replace(f, lookup=replace(f.lookup, cpp_key=("B", "M", "N", "K")))


def _a4w4_gemm_0_1_7(f: TableFamily) -> TableFamily:
    """ops/gemm_op_a4w4.py:77-131: the caller passes out ([M padded to 32, N]: the asm path asserts it)."""
    entry = replace(A4W4_OP, where="ops/gemm_op_a4w4.py:77-131",
                    args=A4W4_XW + (tensor("(M+31)//32*32", "N", dtype="torch.bfloat16"),))
    return replace(f, op=replace(f.op, op_entries=(entry,), op_paths=(
        OpPath("ops/gemm_op_a4w4.py:98-101", "RuntimeError: A4W4 GEMM kernel is not supported on gfx942",
               when=(("gfx", "==", "gfx942"),)),)))


def _a8w8_bpreshuffle_gemm_0_1_7(f: TableFamily) -> TableFamily:
    """ops/gemm_op_a8w8.py:409-411, :466-467, :512: these ops call the lookup and drop its row."""
    return replace(f, lookup=replace(f.lookup, aiter_lookup="aiter/ops/gemm_op_a8w8.py:get_bpreshuffle_GEMM_config",
                                     padding="exact", cpp_key=None),
                   op=replace(f.op, libtype_use=(), aiter_op=None))


def _fmoe_0_1_7(f: TableFamily) -> TableFamily:
    """fused_moe.py:505-580: str(activation) in the key, no dedup (set_index().to_dict raises on a repeat), no gfx,
    tokens padded 16 / nextPow2 / 1024 (get_padded_M :484-492); no xbf16 nor flat read (fused_moe.py:632-636)."""
    return replace(f, lookup=replace(f.lookup, lookup_ignores=(), padding="moe_0_1_7"),
                   loader=replace(f.loader, duplicate_keys="raise", backfill_gfx=False, dropped_rows=()),
                   deploy=replace(f.deploy, overlay_first=False),
                   op=replace(f.op, moe_op=FMOE_OP_0_1_7, read_cells=(
                       ReadCell("block_m", "int", "fused_moe.py:632"),
                       ReadCell("run_1stage", "int", "fused_moe.py:636"))))


CURRENT = AiterRelease(name="current", version_prefixes=())
RELEASE_0_1_7 = AiterRelease(
    name="0.1.7", version_prefixes=("0.1.7",), merge_union_columns=False, merge_dedup_extra=(),
    merge_dedup_tag=False, merge_on_duplicate="lowest_us", merge_first_must_exist=True, merge_sorted_by_us=True,
    model_configs_suffix="",
    # core.py:183-186: the bf16 default is aiter/configs/tuned_gemm.csv, a file the wheel does not ship
    default_files=(("bf16_gemm", "tuned_gemm.csv"),),
    lookup_unused=("a8w8_bpreshuffle_gemm", "a8w8_blockscale_gemm", "a8w8_blockscale_bpreshuffle_gemm"),
    overrides=(("bf16_gemm", _bf16_gemm_0_1_7), ("a8w8_gemm", _a8w8_gemm_0_1_7),
               ("a8w8_batched_gemm", _batched_gemm_0_1_7), ("bf16_batched_gemm", _batched_gemm_0_1_7),
               ("a4w4_blockscale_gemm", _a4w4_gemm_0_1_7), ("a8w8_bpreshuffle_gemm", _a8w8_bpreshuffle_gemm_0_1_7),
               ("fmoe", _fmoe_0_1_7)),
)
RELEASES = (RELEASE_0_1_7, CURRENT)


def release_named(name: str) -> AiterRelease:
    return next(r for r in RELEASES if r.name == name)


def release_for(aiter_version: str | None) -> AiterRelease:
    """The release an image's AITER version belongs to; unknown versions are taken as current."""
    for r in RELEASES:
        if aiter_version and any(aiter_version.startswith(p) for p in r.version_prefixes):
            return r
    return CURRENT
