"""What the image's own AITER ships: its configs/ tables, version and commit, reported to the service so
overlays, tuner inputs and engagement checks follow this image's headers (AITER headers change by release)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from app.aiter_install import aiter_commit, aiter_version, flydsl_available

log = logging.getLogger("aiter_tuner.worker")
MAX_REQUEST_BYTES = 4 * 1024 * 1024  # tables go up in batches under the service's body limit


def read_tables(configs: Path) -> dict[str, str]:
    """Every tuned and untuned CSV under configs/ that AITER can load, by path relative to it: configs/ sorted,
    then model_configs/ in AITER's own glob order (file system order), which decides first-match ties between
    them. Each is read with pandas.read_csv, as AITER reads them (aiter/jit/core.py:280, tuned_gemm.py:87): one
    pandas cannot parse makes AITER raise where it loads it, so it is left out (and logged), not reported."""
    import pandas as pd  # AITER's own dependency: there in every image with AITER
    top = [p for p in sorted(configs.glob("*.csv")) if "tuned" in p.name]
    mc = [p for p in (configs / "model_configs").glob("*.csv") if "tuned" in p.name] \
        if (configs / "model_configs").is_dir() else []
    out = {}
    for p in top + mc:
        try:
            pd.read_csv(p)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            log.warning("%s: AITER cannot load it (pandas: %s); not reported", p, str(e).strip()[:200])
            continue
        out[str(p.relative_to(configs))] = p.read_text(errors="replace")
    return out


def batches(tables: dict[str, str], limit: int = MAX_REQUEST_BYTES) -> list[dict[str, str]]:
    out: list[dict[str, str]] = [{}]
    size = 0
    for path, text in tables.items():
        if out[-1] and size + len(text) > limit:
            out.append({})
            size = 0
        out[-1][path] = text
        size += len(text)
    return [b for b in out if b]


def report(client: Any, digest: str, pkg: Path, commit: str | None = None, flydsl: bool | None = None
           ) -> dict[str, int]:
    """PUT the image's tables to the service, and whether FlyDSL is usable here; returns tables per family."""
    version, commit = aiter_version(pkg), commit or aiter_commit(pkg)
    flydsl = flydsl_available() if flydsl is None else flydsl
    stored: dict[str, int] = {}
    for chunk in batches(read_tables(pkg / "configs")):
        out = client.put_tables(digest, {"aiter_version": version, "aiter_commit": commit, "flydsl": flydsl,
                                         "configs_dir": str(pkg / "configs"), "tables": chunk})
        for fam, n in out["stored"].items():
            stored[fam] = stored.get(fam, 0) + n
    return stored
