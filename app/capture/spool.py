"""The agent's local state, in one file written atomically: the log position read so far, the metrics last
seen, and the captures not yet acknowledged. One write commits both "these lines are read" and "their capture
waits to be sent", so a crash between the two cannot lose or double a line; a capture re-sent after a crash
carries the same capture_uid and the service counts it once."""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from pathlib import Path
from typing import Any


class SpoolBusy(RuntimeError):
    pass


class Spool:
    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.dir / "lock", "w")
        try:  # two agents on one spool would each send the other's captures
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SpoolBusy(f"another capture agent holds {self.dir}") from None
        self.path = self.dir / "state.json"
        self.state: dict[str, Any] = {"agent": uuid.uuid4().hex[:12], "seq": 0, "log": None, "metrics": None,
                                      "families": [], "pending": []}
        if self.path.exists():
            self.state.update(json.loads(self.path.read_text()))

    @property
    def pending(self) -> list[dict[str, Any]]:
        return self.state["pending"]

    def next_uid(self, family: str, part: int = 0) -> str:
        return f"{self.state['agent']}-{self.state['seq']:08d}-{family}-{part}"

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(self.state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def reject(self, body: dict[str, Any], why: str) -> Path:
        """A capture the service refuses for good (4xx on its content) is set aside, never dropped."""
        out = self.dir / f"rejected-{body.get('capture_uid', 'x')}.json"
        out.write_text(json.dumps({"why": why, "capture": body}))
        return out

    def close(self) -> None:
        self._lock.close()
