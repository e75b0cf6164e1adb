"""A benchmark's --before REF: that commit checked out beside this one, to measure both in the same run."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def checkout(ref: str | None, tmp: Path) -> Iterator[Path | None]:
    """REF's tree (a detached git worktree under tmp) for the with-block, removed after; None without a ref."""
    if ref is None:
        yield None
        return
    path = tmp / "before"
    made = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), ref],
                          capture_output=True, text=True)
    if made.returncode:
        raise SystemExit(f"--before {ref}: git worktree add failed: {made.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], capture_output=True)
