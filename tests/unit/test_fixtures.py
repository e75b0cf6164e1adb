"""The AITER tables shipped as fixtures are AITER's own (whole, or their first rows), and AITER's sources come
through the one setting in tests/conftest.py."""

from __future__ import annotations

import csv
import hashlib

from tests.conftest import AITER_COMMIT, ROOT, VENDORED_SRC, aiter_src, configs_dir

FIXTURES = ROOT / "tests" / "fixtures" / "aiter"


def test_every_fixture_table_is_aiters_own_or_its_first_rows():
    sources = list(csv.DictReader(open(FIXTURES / "SOURCES.csv")))
    assert sources and {s["path"] for s in sources} == {
        str(p.relative_to(FIXTURES / "configs")) for p in (FIXTURES / "configs").rglob("*.csv")}
    for s in sources:
        data = (FIXTURES / "configs" / s["path"]).read_bytes()
        if s["cut_to_rows"]:
            assert len(data.decode().splitlines()) == 1 + int(s["cut_to_rows"]) < 1 + int(s["rows"]), s["path"]
        else:
            assert hashlib.sha256(data).hexdigest() == s["sha256"], s["path"]
    assert "MIT License" in (FIXTURES / "LICENSE").read_text()
    full = ROOT.parent / "shared" / "aiter-configs"  # where the full tables are at hand, the cut ones are prefixes
    if full.is_dir():
        for s in sources:
            original = (full / s["path"]).read_bytes()
            assert hashlib.sha256(original).hexdigest() == s["sha256"], s["path"]
            assert original.startswith((FIXTURES / "configs" / s["path"]).read_bytes()), s["path"]


def test_configs_dir_is_the_fixtures_by_default():
    assert (configs_dir() / "bf16_tuned_gemm.csv").exists()


def test_aiters_sources_come_through_the_one_setting():
    src = aiter_src()  # skips, and says so in the terminal summary, where none is to be had
    assert (src / "aiter" / "jit" / "core.py").exists()


def test_the_vendored_sources_are_aiters_own_files():
    """tests/fixtures/aiter/src: each file as SOURCES.csv names it (sha256), nothing unlisted, and byte for byte
    ../shared/aiter-src's where that has the file (the same pinned commit)."""
    sources = list(csv.DictReader(open(VENDORED_SRC / "SOURCES.csv")))
    assert sources and {s["path"] for s in sources} == {
        str(p.relative_to(VENDORED_SRC)) for p in VENDORED_SRC.rglob("*") if p.is_file()} - {"SOURCES.csv"}
    assert AITER_COMMIT in (FIXTURES / "make_src.py").read_text()
    shared = ROOT.parent / "shared" / "aiter-src"
    for s in sources:
        data = (VENDORED_SRC / s["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == s["sha256"] and len(data) == int(s["bytes"]), s["path"]
        if (shared / s["path"]).is_file():
            assert (shared / s["path"]).read_bytes() == data, s["path"]
