"""How to deploy an overlay so AITER really loads it (aiter-tuning.md section 9, aiter/jit/core.py:266-431).

Setting AITER_CONFIG_X replaces the shipped table (the default and model_configs/ are no longer read), so
the value must list them, joined by ':'; a key that appears twice in that list makes AITER rewrite the
shipped CSVs in place and raise, so an overlay layered that way must not repeat a shipped key.
"""

from __future__ import annotations

from app.domain.families import TableFamily
from app.domain.keys import row_key
from app.domain.tables import Table


def collision_key(family: TableFamily, untuned_header: tuple[str, ...], header: tuple[str, ...]
                  ) -> tuple[str, ...]:
    """The merge key, less act_type for fmoe: its lookup ignores act_type, so rows differing only there
    collide at run time (the first in file order wins, aiter-tuning.md 2.7)."""
    keys = family.merge_key(header, untuned_header)
    return tuple(k for k in keys if k != "act_type") if family.name == "fmoe" else keys


def collisions(family: TableFamily, untuned_header: tuple[str, ...], shipped: list[Table], overlay: Table
               ) -> list[tuple[dict[str, str], str]]:
    """Overlay rows whose merge key a shipped table of the family already has: (key cells, shipped file)."""
    out = []
    for t in shipped:
        keys = collision_key(family, untuned_header, t.header)
        have = {row_key(keys, r) for r in t.rows}
        for r in overlay.rows:
            if row_key(keys, r) in have:
                out.append(({k: r.get(k, "") for k in keys}, t.name))
    return out


REQUIRED_FILLED = ("kernelName", "libtype", "kernelName1", "kernelName2")


def unfilled(table: Table) -> list[tuple[int, str]]:
    """(row index, column) of cells AITER would read as 0 or NaN where a kernel is named (core.py:289-308)."""
    return [(i, c) for i, r in enumerate(table.rows) for c in REQUIRED_FILLED if c in table.header and not r.get(c)]


def plan(family: TableFamily, configs_dir: str | None, shipped_paths: list[str], overlay_name: str,
         mount: str = "/overlays") -> dict:
    base = configs_dir or "<aiter package>/aiter/configs"
    listed = [f"{base}/{p}" for p in shipped_paths]
    layer = ":".join(listed + [f"{mount}/{overlay_name}"])
    notes = [
        f"Setting {family.env_var} replaces the shipped table: the 'layer' value lists the image's default and "
        "model_configs tables first, joined by ':' (a comma is not a separator).",
        "Set it before `import aiter` and restart the server: AITER caches tables per process. A multi-path value "
        f"is merged into /tmp/aiter_configs/{family.merge_name}.csv, shared by every process on the host.",
        "Set AITER_LOG_TUNED_CONFIG=1 before import to log tuned hits, then POST the log to /v1/engagement/logs "
        "to count hits and misses per shape.",
    ]
    if family.compiled:
        notes.append(f"{family.name} kernels come from a table compiled into AITER's CK JIT module: deploy with "
                     f"AITER_REBUILD=1 in this image, with {family.env_var} already set so the overlay is visible at "
                     "build time (without a rebuild splitK and kernel mismatch, or a name-keyed kernel is missing).")
    if family.name == "fmoe":
        notes.append("fused_moe_dp_shared_expert.py reads aiter/configs/tuned_fmoe.csv directly and ignores the "
                     "env var; fmoe rows that differ from a shipped row only in act_type are matched first-wins.")
    if family.name == "grouped_fmoe":
        notes.append("AITER_CONFIG_GROUPED_FMOE bypasses merge and dedup: empty cells are wildcards, lowest us wins.")
    if family.name == "fhmoe":
        notes.append("fhmoe has no us column: any duplicate key in a multi-file merge raises RuntimeError.")
    return {
        "family": family.name, "env_var": family.env_var,
        "layer": {"env": f"{family.env_var}={layer}", "files": listed + [f"{mount}/{overlay_name}"],
                  "overlay": f"{mount}/{overlay_name}"},
        "merged": {"env": f"{family.env_var}={mount}/merged_{overlay_name}", "file": f"{mount}/merged_{overlay_name}"},
        "model_configs_dropin": {"copy_to": f"{base}/model_configs/{overlay_name}",
                                 "why": "merged with no env var set: the name contains "
                                        f"'{family.merge_name}' and not 'untuned'"},
        "rebuild": "AITER_REBUILD=1" if family.compiled else None,
        "log_hits": "AITER_LOG_TUNED_CONFIG=1",
        "notes": notes,
    }
