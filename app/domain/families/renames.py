"""Kernels AITER renamed between releases without changing them: the rule (KernelRename) and the renames seen
in its shipped tables, which an image upgrade carries rows across (app/domain/upgrade.py)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelRename:
    """AITER renamed a family's kernels in `release` without changing them: a name in the old format, rewritten by
    pattern -> repl (re.sub on the whole name), is the same kernel's name from that release on. The pattern
    matches the old format only, so a name already new is left as it is. seen: where the rename shows.
    fields: where the new name holds row cells the old one did not: (placeholder, column, {cell: text}); each
    "{placeholder}" in repl is the text of the row's cell; without the row, or for a cell not in the map, the name is
    left as it is (no guess)."""
    release: str
    pattern: str
    repl: str
    seen: str
    fields: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = ()

    def apply(self, name: str, row: Mapping[str, object] | None = None) -> str:
        repl = self.repl
        for placeholder, column, texts in self.fields:
            text = dict(texts).get(str((row or {}).get(column) or "").strip())
            if text is None:
                return name
            repl = repl.replace("{" + placeholder + "}", text)
        return re.sub(f"^(?:{self.pattern})$", repl, name)


# v0.1.10's CK blockscale instance names gained a field before the A/B transfer thread clusters, holding the value
# of the CShuffle field near the end (…_16x16_16x16_16x16x1_…_4_1x1_intrawave_v1 -> …_16x16_16x16_1x1_16x16x1_…):
# 43 of the 78 keys aiter/configs/a8w8_blockscale_tuned_gemm.csv ships in both v0.1.9 and v0.1.10 name the same
# kernel once rewritten (0 before), the others a different tile
BLOCKSCALE_1X1 = KernelRename(
    "v0.1.10", r"(a8w8_blockscale_\d+x\d+x\d+_\d+x\d+x\d+x\d+_\d+x\d+_\d+x\d+_)"
               r"(\d+x\d+x\d+_\d+x\d+x\d+_\d+x\d+x\d+x\d+_\d+_(\d+x\d+)_.*)",
    r"\g<1>\g<3>_\g<2>", "aiter/configs/a8w8_blockscale_tuned_gemm.csv v0.1.9 -> v0.1.10")
# v0.1.15's FlyDSL bpreshuffle names gained a fifth tiling field, 0 for every kernel v0.1.14 had
# (…_F8_F8_B16_2x0x1x2_default -> …_2x0x1x2x0_default): all 550 keys aiter/configs/a8w8_bpreshuffle_tuned_gemm.csv
# ships in both releases name the same kernel once rewritten (359 before)
FLYDSL_BPRESHUFFLE_X0 = KernelRename(
    "v0.1.15", r"(flydsl_bpreshuflle_\d+x\d+x\d+_[A-Z0-9]+_[A-Z0-9]+_[A-Z0-9]+_\d+x\d+x\d+x\d+)(_[a-z]+)",
    r"\g<1>x0\g<2>", "aiter/configs/a8w8_bpreshuffle_tuned_gemm.csv v0.1.14 -> v0.1.15")
# v0.1.6's CK 2-stage MoE instance names (csrc/ck_gemm_moe_2stages_codegen/gemm_moe_ck2stages_common.py:40-66 and
# :84-108 at v0.1.6) name the quant type by its QuantType number (csrc/include/aiter_enum.h:11) where v0.1.5's
# shipped names spelt it, and end with the A, B and output dtypes (aiter/ops/moe_op.py:310 dtype2str_dict,
# upper-cased): …_Nswizzle0_per_token_MulRoutedWeight1 -> …_Nswizzle0_Quant2_MulRoutedWeight1_F8_F8_B16. Those are
# the row's q_type, q_dtype_a, q_dtype_w and dtype. Of the 342 keys aiter/configs/tuned_fmoe.csv ships in both
# releases, every stage name whose tile and pipeline stayed (163 kernelName1, 291 kernelName2) is the old one
# rewritten (0 before); 189 keys name the same kernel pair once rewritten (0 before)
_FMOE_DTYPE = (("torch.bfloat16", "B16"), ("torch.float16", "F16"), ("torch.float8_e4m3fnuz", "F8"),
               ("torch.float8_e4m3fn", "F8"), ("torch.int8", "I8"))
FMOE_CK_QUANT = KernelRename(
    "v0.1.6", r"(moe_ck2stages_gemm[12]_\d+x\d+x\d+x\d+_\d+x\d+_[A-Za-z0-9]+_v\d+_Nswizzle\d)"
              r"_(?:no|per_tensor|per_token|per_1x32|per_1x128)_(MulRoutedWeight\d(?:_silu|_gelu)?)",
    r"\g<1>_Quant{q}_\g<2>_{a}_{w}_{c}", "aiter/configs/tuned_fmoe.csv v0.1.5 -> v0.1.6",
    fields=(("q", "q_type", (("QuantType.No", "0"), ("QuantType.per_Tensor", "1"), ("QuantType.per_Token", "2"),
                             ("QuantType.per_1x32", "3"), ("QuantType.per_1x128", "4"))),
            ("a", "q_dtype_a", _FMOE_DTYPE), ("w", "q_dtype_w", _FMOE_DTYPE), ("c", "dtype", _FMOE_DTYPE)))

