"""Backend `aiter`: run the image's own AITER tuner script on a leased batch and read its tuned CSV back.

Command lines follow aiter/utility/base_tuner.py (-i/-o/--mp/--batch/--timeout; `--batch 1` makes the
tuner write its output after every shape, so results are posted while it runs). `-o` is always given
(with --preshuffle the default output is the wrong file). Tuners exit 1 when any shape failed; shapes
with no row in the output are reported failed with the tuner's last output lines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from app.domain.families import TableFamily, get_family
from app.domain.keys import row_key
from app.domain.tables import Table, read_table, render_csv
from workers.backends.base import Batch, Emit, ShapeResult, now_iso

TUNABLE = [name for name in ("bf16_gemm", "a8w8_gemm", "a8w8_bpreshuffle_gemm", "a8w8_blockscale_gemm",
                             "a8w8_blockscale_bpreshuffle_gemm", "a4w4_blockscale_gemm", "a8w8_batched_gemm",
                             "bf16_batched_gemm", "fmoe")]


def default_aiter_root() -> Path | None:
    env = os.environ.get("AITER_ROOT")
    if env:
        return Path(env)
    try:
        import importlib.util
        spec = importlib.util.find_spec("aiter")
    except (ImportError, ValueError):
        return None
    if not spec or not spec.origin:
        return None
    site = Path(spec.origin).resolve().parents[1]
    # a wheel install ships the tuner scripts under aiter_meta/csrc; a source checkout has csrc/ at its root
    return site / "aiter_meta" if (site / "aiter_meta" / "csrc").is_dir() else site


def tuner_command(family: TableFamily, root: Path, untuned: Path, tuned: Path, timeout_s: int, mp: int = 1,
                  python: str = sys.executable, extra: tuple[str, ...] = ()) -> list[str]:
    if family.tuner_script is None:
        raise ValueError(f"{family.name} has no AITER tuner")
    return [python, str(root / family.tuner_script), "-i", str(untuned), "-o", str(tuned), *family.tuner_args,
            "--mp", str(mp), "--batch", "1", "--timeout", str(max(1, timeout_s)), *extra]


def run_config_command(family: TableFamily, root: Path, tuned_csv: Path, untuned: Path,
                       python: str = sys.executable) -> list[str]:
    """AITER's own replay of tuned rows through the production op (sets AITER_REBUILD=2 itself)."""
    if family.tuner_script is None:
        raise ValueError(f"{family.name} has no AITER tuner")
    return [python, str(root / family.tuner_script), "-i", str(untuned), "--run_config", str(tuned_csv),
            *family.tuner_args]


def untuned_csv(family: TableFamily, shapes: list[dict[str, Any]], header: tuple[str, ...] | None = None) -> str:
    header = header or family.untuned_header
    return render_csv(header, [s["shape"] for s in shapes])


def _err(family: TableFamily, row: dict[str, str]) -> float | None:
    vals = []
    for col in family.err_columns:
        raw = (row.get(col) or "").strip()
        if not raw or raw == "Null":
            continue
        vals.append(float(raw.rstrip("%")) / 100 if raw.endswith("%") else float(raw))
    return max(vals) if vals else (0.0 if not family.err_columns else None)


def _us(row: dict[str, str]) -> float | None:
    try:
        return float(row.get("us", ""))
    except ValueError:
        return None


def match_rows(family: TableFamily, lease: dict[str, Any], table: Table) -> dict[int, dict[str, str]]:
    """shape_id -> the tuner's row for it (the tuner stamps rows with the live gfx and cu_num)."""
    keys = tuple(c for c in family.key_columns if c in table.header)
    by_key = {row_key(keys, r): r for r in table.rows}
    out = {}
    for item in lease["shapes"]:
        want = dict(item["shape"], gfx=lease["gfx"], cu_num=str(lease["cu_num"]))
        row = by_key.get(row_key(keys, want))
        if row is not None:
            out[item["shape_id"]] = row
    return out


def result_from_row(family: TableFamily, lease: dict[str, Any], shape_id: int, row: dict[str, str],
                    elapsed_s: float, started: str) -> ShapeResult:
    us, err = _us(row), _err(family, row)
    kernel = row.get("kernelName") or "+".join(x for x in (row.get("kernelName1"), row.get("kernelName2")) if x)
    header = lease.get("tuned_header") or list(family.tuned_header)
    out_row = {c: row.get(c, "") for c in header}
    return ShapeResult(shape_id, "ok", row=out_row, us=us, err_ratio=err, kernel_name=kernel or None,
                       elapsed_s=elapsed_s, started_at=started, finished_at=now_iso())


class AiterBackend:
    name = "aiter"
    families = TUNABLE

    def __init__(self, root: Path | None = None, mp: int = 1, python: str = sys.executable, poll_s: float = 1.0,
                 margin_s: float = 5.0, extra: tuple[str, ...] = ()):
        self.root = root or default_aiter_root()
        self.mp, self.python, self.poll_s, self.margin_s, self.extra = mp, python, poll_s, margin_s, extra

    def run(self, batch: Batch, emit: Emit) -> None:
        if self.root is None:
            raise RuntimeError("aiter backend: AITER not found (set AITER_ROOT or install aiter)")
        family = get_family(batch.lease["family"])
        with tempfile.TemporaryDirectory(prefix="aiter-lease-") as tmp:
            untuned, tuned = Path(tmp, family.untuned_file), Path(tmp, family.tuned_file)
            header = tuple(batch.lease.get("untuned_header") or family.untuned_header)  # the image's own
            untuned.write_text(untuned_csv(family, batch.lease["shapes"], header))
            timeout = int(batch.time_left() - self.margin_s)
            cmd = tuner_command(family, self.root, untuned, tuned, timeout, self.mp, self.python, self.extra)
            self._drive(batch, family, cmd, tuned, emit, cwd=self.root)

    def _drive(self, batch: Batch, family: TableFamily, cmd: list[str], tuned: Path, emit: Emit, cwd: Path) -> None:
        started, t0 = now_iso(), time.monotonic()
        tail: deque[str] = deque(maxlen=40)
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        _pump(proc, tail)
        posted: set[int] = set()
        last_t = t0
        while True:
            done = proc.poll() is not None
            if tuned.exists():
                for sid, row in match_rows(family, batch.lease, read_table(tuned.read_text(), str(tuned))).items():
                    if sid not in posted:
                        now = time.monotonic()
                        emit(result_from_row(family, batch.lease, sid, row, now - last_t, started))
                        posted.add(sid)
                        last_t = now
            if done:
                break
            if batch.should_stop() or batch.time_left() <= self.margin_s / 2:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                if batch.should_stop():
                    return  # abandoned: the agent releases the rest
                tail.append("[agent] tuner stopped at the lease budget")
                break
            time.sleep(self.poll_s)
        why = f"AITER tuner exit {proc.returncode}; no row for this shape. Last output:\n" + "\n".join(tail)
        for item in batch.lease["shapes"]:
            if item["shape_id"] not in posted:
                emit(ShapeResult(item["shape_id"], "failed", error=why[-4000:], elapsed_s=time.monotonic() - last_t,
                                 started_at=started, finished_at=now_iso()))


def _pump(proc: subprocess.Popen, tail: deque[str]) -> None:
    import threading

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
    threading.Thread(target=read, daemon=True).start()
