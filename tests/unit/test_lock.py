"""requirements-lock.txt pins every package the test command installs (`pip install -c requirements-lock.txt -e
'.[dev]'`, scripts/test.sh): a dependency added to pyproject.toml without re-running scripts/lock.sh would be
resolved to whatever the index serves that day, so it fails here."""

from __future__ import annotations

import importlib.metadata as md

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import ROOT

SKIPPED_BY_LOCK_SH = {"aiter-tuner", "pip", "setuptools", "wheel"}  # scripts/lock.sh's grep -v


def closure(name: str, extras: set[str]) -> set[str]:
    """The installed distributions name[extras] requires, transitively (markers evaluated here)."""
    seen: dict[str, set[str]] = {}
    todo = [(name, extras)]
    while todo:
        dist, ex = todo.pop()
        key = canonicalize_name(dist)
        if key in seen and ex <= seen[key]:
            continue
        seen[key] = seen.get(key, set()) | ex
        try:
            requires = md.requires(dist) or []
        except md.PackageNotFoundError:  # not installed: its install would have failed, not this check
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ex | {""}):
                todo.append((req.name, set(req.extras)))
    return set(seen)


def pinned(text: str) -> set[str]:
    return {canonicalize_name(line.split("==")[0]) for line in text.splitlines()
            if line.strip() and not line.startswith("#")}


def test_the_lock_pins_everything_the_test_command_installs():
    lock = (ROOT / "requirements-lock.txt").read_text()
    assert all("==" in line for line in lock.splitlines() if line.strip() and not line.startswith("#"))
    needed = closure("aiter-tuner", {"dev"}) - SKIPPED_BY_LOCK_SH
    assert {"mypy", "pyyaml", "torch", "fastapi"} <= needed  # the walk reaches the extras' own requirements
    missing = needed - pinned(lock)
    assert not missing, f"not in requirements-lock.txt (run scripts/lock.sh): {sorted(missing)}"
