"""The aiter backend's graph-captured confirmation (issue 34): AITER's own harness (run_perftest under
--run_config) times each kernel with the profiler over a short run in one process, with no output check of the
timed calls, no negative control and no capture-to-capture variance. Where a family has a ReplaySpec
(app/domain/families.py), this runs in the image's Python after the confirmation: the tuner script's own data
generator, reference and per-kernel entry (gemm_a8w8_tune.py:74-108 generate_data / gemm_a8w8_ref /
run_gemm_a8w8, the functions its run_config and tune use) and the production op for the default path, each
finalist and the default timed by the torch race's final round: Schedule.captures capture windows of CUDA graphs
(eager calls where a kernel cannot be captured), a guarded replay checked against the reference before its samples
count, both negative controls on every finalist, the SNR gate of an fp8 family, the control kernel's busy check,
and the capture-aware decision (the default, then the incumbent, keep a tie).

Run as a script: python -m workers.backends.aiter_replay JOB.json OUT.json, JOB = {"root", "family", "device",
"shapes": [{"shape_id", "cells": {column: value}, "incumbent", "finalists": [{"name", "kernelId", "splitK"}]}]};
OUT = one record per shape (winner, us, default_us, confidence, spread, timing, candidates) or its error.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from app.domain.families import SNR_MIN_DB_OF_MATH, ReplaySpec, TableFamily, get_family
from workers.backends import torch_race
from workers.backends.base import GpuBusy

DEFAULT_PATH = "aiter_default_path"  # as in aiter_tuner.py: what the image runs with no row


def load_tuner(root: Path, family: TableFamily) -> Any:
    """The family's tuner script as a module (its directory on sys.path, as when AITER runs it)."""
    assert family.tuner_script
    path = root / family.tuner_script
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"_aiter_replay_{family.name}", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cell(v: str) -> Any:
    """A shape cell as AITER's run_config reads it: eval for dtypes (gemm_a8w8_tune.py:156 eval(q_dtype_w)),
    in the names that tuner module has (torch, aiter's dtypes)."""
    ns: dict[str, Any] = {"torch": torch}
    try:
        from aiter import dtypes
        ns["dtypes"] = dtypes
    except ImportError:  # a stand-in without AITER: torch names only
        pass
    return eval(v, ns)  # noqa: S307 -- AITER's own reading of the cell


def _candidates(spec: ReplaySpec, tuner: Any, op: Callable[..., Any], item: dict[str, Any], device: str
                ) -> tuple[list[torch_race.Candidate], torch.Tensor, torch.dtype]:
    """The default path and every finalist as race candidates over the tuner module's own data, the
    reference (float64) and the output dtype."""
    cells = item["cells"]
    m, n, k = int(cells["M"]), int(cells["N"]), int(cells["K"])
    data = getattr(tuner, spec.data)(m, n, k, 0, torch.bfloat16, *(_cell(cells[c]) for c in spec.data_args),
                                     device=device)
    ins = [data[x] for x in spec.inputs]
    ref = getattr(tuner, spec.ref)(*ins).double()
    kernel = getattr(tuner, spec.kernel)

    def one(kid: int, sk: int) -> Callable[[], torch.Tensor]:
        out = torch.empty_like(data["out"])
        return lambda: kernel(*ins, out, kid, sk)
    cands = [torch_race.Candidate(DEFAULT_PATH, "aiter", 0, lambda: op(*ins))]
    for f in item["finalists"]:
        sk = int(f.get("splitK") or 0)
        cands.append(torch_race.Candidate(f["name"], "aiter", sk, one(int(f["kernelId"]), sk)))
    return cands, ref, data["out"].dtype


def _record(item: dict[str, Any], race: torch_race.Race) -> dict[str, Any]:
    """One shape's result: the winner, its time and the default's, the decision and every candidate."""
    win = race.winner
    default = next((e for e in race.entries if e.name == DEFAULT_PATH and e.final), None)
    stats = win.stats() if win else {}
    return {"shape_id": item["shape_id"], "winner": win.name if win else None,
            "us": win.median * 1e6 if win else None, "default_us": default.median * 1e6 if default else None,
            "confidence": race.confidence, "spread": stats.get("spread"),
            "timing": {"decision": race.decision, "reason": (race.reason or "")[:1000], "windows": race.windows,
                       "busy_windows": len(race.busy), **stats},
            "candidates": [e.record() for e in race.entries], "error": race.error}


def race_shape(backend: torch_race.TorchBackend, family: TableFamily, tuner: Any, op: Callable[..., Any],
               item: dict[str, Any], device: str) -> dict[str, Any]:
    """Every candidate checked (and its negative controls) before it is timed, then the final round's
    capture windows (guarded), and the decision with the default, then the incumbent, keeping a tie."""
    assert family.replay is not None
    cands, ref, out_dtype = _candidates(family.replay, tuner, op, item, device)
    entries = [torch_race.Entry(c) for c in cands]
    live = [e for e in entries if backend._check(e, ref, out_dtype)]
    race = torch_race.Race(entries, "replay")
    backend._check_ref = (ref, out_dtype)
    try:
        backend._final(race, live, backend.schedule.final)
        protected = [x for x in (DEFAULT_PATH, item.get("incumbent")) if x]
        backend._settled(race, protected, backend.schedule.final)
    finally:
        backend._check_ref = None
    return _record(item, race)


def run_job(job: dict[str, Any], tuner: Any = None, op: Callable[..., Any] | None = None) -> list[dict[str, Any]]:
    family = get_family(job["family"])
    assert family.replay is not None, f"{family.name} has no replay spec"
    tuner = tuner or load_tuner(Path(job["root"]), family)
    if op is None:
        mod, fn = family.replay.op.split(":")
        op = getattr(importlib.import_module(mod), fn)
    backend = torch_race.TorchBackend(device=job.get("device", "cuda:0"), repeats=int(job.get("repeats", 30)),
                                      llc_bytes=job.get("llc_bytes"), busy_drift=job.get("busy_drift"))
    backend.snr_min_db = SNR_MIN_DB_OF_MATH.get(family.math)
    out = []
    for item in job["shapes"]:
        try:
            out.append(race_shape(backend, family, tuner, op, item, job.get("device", "cuda:0")))
        except GpuBusy as e:  # the device is shared: the lease goes back with the reason
            out.append({"shape_id": item["shape_id"], "busy": str(e)})
            break
        except Exception as e:  # one shape's failure is its own
            out.append({"shape_id": item["shape_id"], "error": f"{type(e).__name__}: {e}"[:2000]})
    return out


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(run_job(job), default=str))


if __name__ == "__main__":
    main()
