"""Table schemas: the headers AITER releases write, and how an unseen header is understood.

A family's definition (families.py) is the header ROCm/aiter writes today. Older releases and model_configs
files use other headers (the fmoe default has no gfx and ends in _tag; a late-2025 bf16 table had no gfx and
no bpreshuffle). A schema is the header of one image's own table: column order for output, plus the key
columns the family's loader indexes on that are present in it.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.families import TableFamily

# Headers seen in released tables, besides each family's current tuned_header.
# The bf16 one is ROCm/aiter before the gfx/bpreshuffle columns were added (late 2025).
KNOWN_TUNED_VARIANTS: dict[str, tuple[str, ...]] = {
    "bf16_gemm": (
        "M,N,K,bias,dtype,outdtype,scaleAB,cu_num,libtype,solidx,splitK,us,kernelName,err_ratio,tflops,bw",
    ),
    "fmoe": (
        "cu_num,token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,use_g1u1,"
        "doweight_stage1,block_m,ksplit,us1,kernelName1,err1,us2,kernelName2,err2,us,run_1stage,tflops,bw,_tag",
        "cu_num,token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,use_g1u1,"
        "doweight_stage1,block_m,ksplit,us1,kernelName1,err1,us2,kernelName2,err2,us,run_1stage,tflops,bw,xbf16,_tag",
        "cu_num,token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,use_g1u1,"
        "doweight_stage1,block_m,ksplit,us1,kernelName1,err1,us2,kernelName2,err2,us,run_1stage,xbf16,tflops,bw,_tag",
        "cu_num,token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,use_g1u1,"
        "doweight_stage1,block_m,ksplit,us1,kernelName1,err1,us2,kernelName2,err2,us,run_1stage,xbf16,flat,tflops,"
        "bw,_tag",
        "gfx,cu_num,token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,use_g1u1,"
        "doweight_stage1,block_m,ksplit,us1,kernelName1,err1,us2,kernelName2,err2,us,run_1stage,xbf16,flat,tflops,"
        "bw,_tag",
    ),
}

# Shape-only untuned inputs the tuners accept (missing flag columns take the tuner's defaults).
KNOWN_UNTUNED_VARIANTS: dict[str, tuple[str, ...]] = {
    "bf16_gemm": ("M,N,K,bias,dtype,outdtype,scaleAB", "M,N,K"),
    "a8w8_blockscale_bpreshuffle_gemm": ("M,N,K,q_dtype_w",),
    "gdn_k5_opt": ("dtype,K,V,BT,H,Hg,is_varlen,use_h0,store_fs",),
}

# Key columns a loader fills in when a table lacks them: fmoe backfills gfx from cu_num
# (fused_moe.py _ensure_gfx_column); CK GEMM loaders fall back to a cu_num-only key with a WARNING.
# The bf16 loader has no fallback: set_index(["gfx", ...]) raises KeyError.
_BACKFILLED = {"fmoe": {"gfx"}, "a8w8_gemm": {"gfx"}, "a8w8_bpreshuffle_gemm": {"gfx"},
               "a8w8_blockscale_gemm": {"gfx"}, "a8w8_blockscale_bpreshuffle_gemm": {"gfx"},
               "a4w4_blockscale_gemm": {"gfx"}, "a8w8_batched_gemm": {"gfx"}, "bf16_batched_gemm": {"gfx"}}


class HeaderError(ValueError):
    def __init__(self, family: str, missing: list[str], header: tuple[str, ...]):
        self.family, self.missing, self.header = family, missing, header
        super().__init__(f"{family} table header lacks key column(s) {', '.join(missing)} "
                         f"that AITER's loader indexes on; header was: {','.join(header)}")


@dataclass(frozen=True)
class Schema:
    family: str
    header: tuple[str, ...]
    key_columns: tuple[str, ...]  # the family's key columns present in this header, in key order
    known: bool  # header seen in a released table

    def missing_from(self, other_header: tuple[str, ...]) -> list[str]:
        return [c for c in self.header if c not in other_header]


def parse_header_line(line: str) -> tuple[str, ...]:
    # AITER's runtime pd.read_csv keeps whitespace; a tab after the last name is a real shipped quirk
    return tuple(c.strip() for c in line.strip("\r\n").rstrip("\t").split(","))


def known_tuned_headers(family: TableFamily) -> list[tuple[str, ...]]:
    return [family.tuned_header] + [tuple(h.split(",")) for h in KNOWN_TUNED_VARIANTS.get(family.name, ())]


def known_untuned_headers(family: TableFamily) -> list[tuple[str, ...]]:
    return [family.untuned_header] + [tuple(h.split(",")) for h in KNOWN_UNTUNED_VARIANTS.get(family.name, ())]


def tuned_schema(family: TableFamily, header: tuple[str, ...]) -> Schema:
    """Understand a tuned-table header by its columns; refuse one that lacks a key column."""
    optional = _BACKFILLED.get(family.name, set())
    missing = [c for c in family.key_columns if c not in header and c not in optional]
    if missing:
        raise HeaderError(family.name, missing, header)
    keys = tuple(c for c in family.key_columns if c in header)
    return Schema(family.name, header, keys, header in known_tuned_headers(family))


def untuned_header_ok(family: TableFamily, header: tuple[str, ...]) -> list[str]:
    """Problems with an untuned (tuner input) header: unknown columns, or missing dimension columns."""
    allowed = set(family.shape_columns) | set(family.tuned_header) | {"gfx", "cu_num"}
    allowed |= {c for h in known_untuned_headers(family) for c in h}
    problems = [f"unknown column {c!r}" for c in header if c not in allowed]
    dims = [c for c in family.shape_columns if c == family.m_column or c in ("N", "K", "B", "b", "n", "k")]
    problems += [f"missing column {c!r}" for c in dims if c not in header]
    return problems


def current_schema(family: TableFamily) -> Schema:
    return tuned_schema(family, family.tuned_header)
