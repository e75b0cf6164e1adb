"""The worker's spool: finished results not yet acknowledged by the service, in one append-only journal.

A result is appended and fdatasync'd before it is posted (on disk first: a crash, a kill or a long outage loses
none), and an acknowledgement line is appended once the service answered. One append to an open file costs
0.15-0.2 ms against 0.45-0.6 ms for a file per result (create, fsync, rename, unlink), and a quarter of the CPU
(benchmarks/RESULTS.md, orchestration overhead): it is paid on every shape a worker tunes.

Acknowledgements are not synced: one lost in a crash re-sends a result the service already has, which it
answers as a duplicate and stores once. A process killed mid-append leaves a torn last line; it is cut off
before the next read, so nothing later is glued to it. The journal is emptied once nothing in it is pending,
and rewritten with only the pending results (a new file renamed over it) when results stay pending while it
grows past COMPACT_BYTES. Appends hold a shared lock and reading (with its truncation) an exclusive one, and an
append finding its file replaced reopens it, so a second process on the same spool directory (a misconfigured
twin worker, a test) never has a fresh record cut away. Each record names the worker its lease was granted to:
a twin that delivers it posts it as that worker (the service lets a worker touch only its own leases; the same
token may act as every worker it registered), never as itself.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from pathlib import Path
from typing import Any

JOURNAL = "results.jsonl"
_datasync = getattr(os, "fdatasync", os.fsync)  # the data and the size, not the times (fsync where absent)
COMPACT_BYTES = 4 << 20


class Spool:
    def __init__(self, root: Path, worker_id: str | None = None):
        self.root, self.worker_id = root, worker_id
        self.owners: dict[str, str] = {}  # lease id -> the worker it was granted to, as last read
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / JOURNAL
        new = not self.path.exists()
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        if new:  # the journal's own directory entry on disk too (once)
            self._sync_dir()
        self._adopt_files()

    def _adopt_files(self) -> None:
        """Results an older agent left as a file each ({"lease_id", "payload"}, before e96d06b): into the journal,
        then the files go; a torn one (a crash mid-write) had nothing to deliver."""
        for path in sorted(self.root.glob("*.json")):
            try:
                d = json.loads(path.read_text())
                self.put(d["lease_id"], d["payload"])
            except (OSError, ValueError, KeyError, TypeError):
                pass
            path.unlink(missing_ok=True)

    def _sync_dir(self) -> None:
        dfd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def close(self) -> None:
        os.close(self._fd)

    def _lock(self, how: int) -> None:
        """Lock the journal, reopened first if another process compacted it (a new file renamed over it)."""
        while True:
            fcntl.flock(self._fd, how)
            if os.fstat(self._fd).st_nlink:
                return
            os.close(self._fd)
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)

    def _append(self, record: dict[str, Any], sync: bool) -> None:
        line = (json.dumps(record) + "\n").encode()  # dumps: json.dump to a file takes the pure-Python encoder
        self._lock(fcntl.LOCK_SH)
        try:
            os.write(self._fd, line)
            if sync:
                _datasync(self._fd)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _compact(self, records) -> None:  # type: ignore[no-untyped-def]
        """Only the pending results, in a new journal renamed over this one (held under the exclusive lock)."""
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(b"".join((json.dumps({"id": i, "lease_id": lid, "payload": p, "worker": self.owner_of(lid)})
                              + "\n").encode()
                             for i, lid, p in records))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._sync_dir()

    def put(self, lease_id: str, payload: dict[str, Any]) -> str:
        """On disk when this returns; the id to acknowledge it with."""
        rid = uuid.uuid4().hex
        self._append({"id": rid, "lease_id": lease_id, "payload": payload, "worker": self.worker_id}, sync=True)
        return rid

    def owner_of(self, lease_id: str) -> str | None:
        """The worker the lease was granted to (this spool's own for a record from before records named it)."""
        return self.owners.get(lease_id, self.worker_id)

    def done(self, rid: str) -> None:
        self._append({"done": rid}, sync=False)

    def pending(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(id, lease id, payload) of every result not acknowledged, in the order they finished."""
        self._lock(fcntl.LOCK_EX)
        try:
            size = os.fstat(self._fd).st_size
            data = os.pread(self._fd, size, 0) if size else b""
            whole = data.rfind(b"\n") + 1
            if whole < len(data):  # a torn last line (killed mid-append): never delivered, cut off
                os.ftruncate(self._fd, whole)
            records: dict[str, tuple[str, str, dict[str, Any]]] = {}
            for line in data[:whole].splitlines():
                try:
                    d = json.loads(line)
                    if "done" in d:
                        records.pop(d["done"], None)
                    else:
                        records[d["id"]] = (d["id"], d["lease_id"], d["payload"])
                        if d.get("worker"):
                            self.owners[d["lease_id"]] = d["worker"]
                except (ValueError, KeyError, TypeError):  # a damaged line: nothing to deliver
                    continue
            if not records and whole:
                os.ftruncate(self._fd, 0)
            elif whole > COMPACT_BYTES:
                self._compact(records.values())
            return list(records.values())
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
