"""What this worker is, the way AITER's tuners see it: gfx and cu_num from torch's device properties."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from app.aiter_install import cpu_count
from app.domain.families import llc_bytes


@dataclass(frozen=True)
class WorkerIdentity:
    gfx: str
    cu_num: int
    device: str  # torch device string the backend runs on
    host: str
    llc_bytes: int | None = None  # the last-level cache a timing scrub must evict (app/domain/families.py)


def detect(gpu: int | None) -> WorkerIdentity:
    """gcnArchName / multi_processor_count on ROCm (what base_tuner.py stamps rows with); sm_XY on CUDA;
    a CPU identity where there is no GPU."""
    host = socket.gethostname()
    try:
        import torch
    except ImportError:  # the aiter backend can run without torch in this process
        torch = None  # type: ignore[assignment]
    if torch is not None and gpu is not None and torch.cuda.is_available() and gpu < torch.cuda.device_count():
        p = torch.cuda.get_device_properties(gpu)
        arch = getattr(p, "gcnArchName", "") or ""
        gfx = arch.split(":", 1)[0] if arch.startswith("gfx") else f"sm_{p.major}{p.minor}"
        llc = llc_bytes(gfx, int(getattr(p, "L2_cache_size", 0) or 0))
        return WorkerIdentity(gfx, int(p.multi_processor_count), f"cuda:{gpu}", host, llc)
    return WorkerIdentity("cpu", cpu_count(), "cpu", host)


def default_worker_id(ident: WorkerIdentity) -> str:
    """<host>-<device>: node3-cuda0 on a GPU, vm1-cpu on a CPU (a worker id may not contain ':')."""
    return f"{ident.host}-{ident.device.replace(':', '')}"
