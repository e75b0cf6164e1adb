"""The house's floors, read from the source (every import, a function's included; those under `if TYPE_CHECKING:`
excepted, as they never run):

- app/domain imports only app/domain and the wire contracts' data models (which import nothing of app's): pure
  rules, no database, no web;
- the request/response models (app/schemas.py) and the wire contracts (app/wire.py, app/ab_wire.py) import only
  each other: services, routes, workers and the capture agent all share them;
- app/services never imports app/api, app/web or app/main (routes call services, not the other way);
- app never imports workers (what both agents probe lives in app/aiter_install.py, standard library only);
- workers never import app/db, app/services, app/api, app/web or app/main (they speak to the service over the wire);
- no import cycle among app's and workers' modules;
- a migration imports nothing of app but app/db/models.py's column types (it runs the code of its day).

A short AST walk rather than import-linter: these rules are all it needs, and a function-level import (the
kind that held the last cycle together) counts here as it does at run time."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("app", "workers")
SKIP = ("app.migrations",)  # Alembic's scripts: run by Alembic, imported by nothing


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*.py")):
            parts = list(p.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            if not any(name == s or name.startswith(s + ".") for s in SKIP):
                out[name] = p
    return out


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            yield from (n for o in node.orelse for n in _imports(ast.Module(body=[o], type_ignores=[])))
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from _imports(node)


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The first-party modules name imports (a `from pkg import mod` names the module, not the package)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        out.update(t for t in targets if t.split(".")[0] in PACKAGES and t != name)
    return out


def graph(root: Path) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def _under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


CONTRACTS = ("app.schemas", "app.wire", "app.ab_wire")


def upward(g: dict[str, set[str]]) -> list[str]:
    """Every import that breaks a floor, as 'importer -> imported: why'."""
    bad = []
    for src, targets in g.items():
        for dst in sorted(targets):
            why = None
            # the wire contracts import nothing of app's (the next rule), so a rule may read their data models
            if _under(src, "app.domain") and not _under(dst, "app.domain") and dst not in ("app.wire", "app.ab_wire"):
                why = "the domain imports only the domain (and the wire contracts' data models)"
            elif src in CONTRACTS and dst not in CONTRACTS:
                why = "the wire and request models import only each other"
            elif _under(src, "app.services") and _under(dst, "app.api", "app.web", "app.main"):
                why = "services never import routes"
            elif _under(src, "app") and _under(dst, "workers"):
                why = "app never imports workers"
            elif _under(src, "workers") and _under(dst, "app.db", "app.services", "app.api", "app.web", "app.main"):
                why = "workers speak to the service over the wire only"
            if why:
                bad.append(f"{src} -> {dst}: {why}")
    return bad


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: each strongly connected set of two or more modules (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the module count (~100)
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in g:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_runs_up_a_floor() -> None:
    g = graph(ROOT)
    assert len(g) > 50 and "app.services.leasing" in g  # the walk found the tree
    assert upward(g) == []


def test_no_import_cycle() -> None:
    assert cycles(graph(ROOT)) == []


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_the_walk_sees_an_upward_import_and_a_cycle(tmp_path: Path) -> None:
    """The checks above are not vacuous: a tree with one import up each floor and a cycle held by a function-level
    import is refused on every count; the same imports under TYPE_CHECKING are not."""
    init = {f"{p}/__init__.py": "" for p in ("app", "app/domain", "app/services", "app/api", "app/db", "workers")}
    _tree(tmp_path, {**init,
                     "app/domain/rules.py": "from app.db import models\n",
                     "app/db/models.py": "",
                     "app/wire.py": "from app.domain import rules\n",
                     "app/schemas.py": "from app.wire import X\n",
                     "app/api/routes.py": "from app.services import a\n",
                     "app/services/a.py": "from app.schemas import X\nfrom . import b\n",
                     "app/services/b.py": "def f():\n    from app.services.a import g\n    from ..api import routes\n",
                     "app/cli.py": "def main():\n    import workers.agent\n",
                     "workers/agent.py": "from app.services import a\nfrom app import wire\n",
                     "app/services/c.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                           "    from app.api import routes\n    from app.services import d\n"),
                     "app/services/d.py": "from app.services import c\n"})
    g = graph(tmp_path)
    assert g["app.services.b"] == {"app.services.a", "app.api.routes"}  # relative and function-level imports
    assert g["app.services.c"] == set()  # TYPE_CHECKING only
    assert upward(g) == [
        "app.cli -> workers.agent: app never imports workers",
        "app.domain.rules -> app.db.models: the domain imports only the domain (and the wire contracts' data models)",
        "app.services.b -> app.api.routes: services never import routes",
        "app.wire -> app.domain.rules: the wire and request models import only each other",
        "workers.agent -> app.services.a: workers speak to the service over the wire only",
    ]
    assert cycles(g) == [["app.api.routes", "app.services.a", "app.services.b"]]


def test_migrations_run_frozen_code() -> None:
    """A migration does what it did when it was written: it imports nothing of app but app/db/models.py's column
    types (UTCDateTime, how a timestamp is stored), never a live rule (0006's roofline estimate is inlined)."""
    known = {"app.db.models": ROOT / "app" / "db" / "models.py"}
    for path in sorted((ROOT / "app" / "migrations" / "versions").glob("*.py")):
        assert imports_of(f"app.migrations.versions.{path.stem}", path, known) <= {"app.db.models"}, path.name
