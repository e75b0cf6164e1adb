"""Complete lines appended to a log, resumable from (inode, offset), across rotation and truncation."""

from __future__ import annotations

import hashlib
import os
import queue
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 20
HEAD = 256  # bytes at the start of the file that identify its content (see _same_head)


@dataclass
class Position:
    inode: int | None
    offset: int
    head: str = ""  # sha1 of the first min(HEAD, offset) bytes


class FileFollower:
    """Reads what was appended since the saved position. Rotation by rename (logrotate's default): the old file is
    drained to its end first, found by inode beside the new one when the agent was down while it rotated.
    Truncation in place (copytruncate): starts again at 0, also when new lines already refilled the file past
    the old position (its first bytes changed). A line without its newline yet waits for it."""

    def __init__(self, path: str, pos: Position | None = None, max_bytes: int = 16 << 20):
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.fh: BinaryIO | None = None
        self.pos = pos or Position(None, 0)
        self.notes: list[str] = []

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None

    def _stat(self) -> os.stat_result | None:
        try:
            return os.stat(self.path)
        except FileNotFoundError:
            return None

    def _rotated_copy(self, inode: int) -> Path | None:
        """The file that was ours before a rotation, renamed beside the log (server.log.1, server.log-2026...)."""
        for p in sorted(self.path.parent.glob(self.path.name + "?*")):
            try:
                if p.stat().st_ino == inode:
                    return p
            except OSError:
                continue
        return None

    def _open(self) -> None:
        st = self._stat()
        if self.pos.inode is not None and (st is None or st.st_ino != self.pos.inode):
            old = self._rotated_copy(self.pos.inode)
            if old is not None:
                self.fh = open(old, "rb")
                self.fh.seek(self.pos.offset)
                self.notes.append(f"resumed in rotated {old.name} at byte {self.pos.offset}")
                return
            if st is not None:
                self.notes.append(f"{self.path} was replaced and its old file is gone: reading the new one from 0")
                self.pos = Position(st.st_ino, 0)
        if st is None:
            return
        self.fh = open(self.path, "rb")
        ino = os.fstat(self.fh.fileno()).st_ino
        if ino != self.pos.inode:
            self.pos = Position(ino, 0)

    def _head(self, n: int) -> str:
        assert self.fh is not None
        return hashlib.sha1(os.pread(self.fh.fileno(), n, 0)).hexdigest()

    def _same_head(self) -> bool:
        """False when the file was truncated in place, whatever its size now."""
        if self.pos.offset == 0 or not self.pos.head:
            return True
        if os.fstat(self.fh.fileno()).st_size < self.pos.offset:  # type: ignore[union-attr]
            return False
        return self._head(min(HEAD, self.pos.offset)) == self.pos.head

    def read(self) -> list[str]:
        """Complete new lines (decoded, newline stripped); self.pos then points just after the last one."""
        out: list[str] = []
        budget = self.max_bytes
        while budget > 0:
            if self.fh is None:
                self._open()
                if self.fh is None:
                    return out
            if not self._same_head():
                self.notes.append(f"{self.path} was truncated: reading it again from 0")
                self.pos.offset, self.pos.head = 0, ""
            self.fh.seek(self.pos.offset)
            data = self.fh.read(min(CHUNK, budget))
            end = data.rfind(b"\n") + 1
            if end:
                out.extend(data[:end].decode("utf-8", errors="replace").splitlines())
                self.pos.offset += end
                budget -= end
                self.pos.head = self._head(min(HEAD, self.pos.offset))
                continue
            if len(data) >= CHUNK:  # one line longer than a chunk: not an AITER line; skip it whole
                self.pos.offset += len(data)
                self.pos.head = self._head(min(HEAD, self.pos.offset))
                continue
            # at the end of this file: if the path now names another file, ours was rotated away
            st = self._stat()
            if st is not None and st.st_ino != os.fstat(self.fh.fileno()).st_ino:
                self.close()
                self.pos = Position(st.st_ino, 0)
                continue
            return out
        return out


class StdinFollower:
    """Lines from standard input (a pipe from `docker logs -f`), read by a thread; no position to resume."""

    def __init__(self) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.pos = Position(None, 0)
        self.notes: list[str] = []
        self.eof = False
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for raw in sys.stdin.buffer:
            self.lines.put(raw.decode("utf-8", errors="replace").rstrip("\n"))
        self.lines.put(None)

    def read(self, wait_eof: bool = False) -> list[str]:
        out = []
        while not self.eof:
            try:
                item = self.lines.get(timeout=None) if wait_eof else self.lines.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self.eof = True
            else:
                out.append(item)
        return out

    def close(self) -> None:
        pass
