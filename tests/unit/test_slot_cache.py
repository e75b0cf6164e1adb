"""app/slot_cache.py: one value per slot at its version, built once however many ask at the same time."""

from __future__ import annotations

import threading

import pytest

from app import slot_cache
from app.slot_cache import SlotCache
from tests.conftest import wait_for


@pytest.fixture
def waiting(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """One entry per asker waiting on a build under way (in its Future's result()): the state the release waits
    for, so an asker that has not come yet (a loaded machine) neither builds again nor finds the value kept."""
    from concurrent.futures import Future
    seen: list[int] = []

    class Counted(Future):
        def result(self, timeout=None):  # type: ignore[no-untyped-def]
            seen.append(1)
            return super().result(timeout)
    monkeypatch.setattr(slot_cache, "Future", Counted)
    return seen


def test_concurrent_first_asks_build_once_and_share_the_value(waiting):
    cache: SlotCache[object] = SlotCache(10)
    started, release = threading.Event(), threading.Event()
    built: list[object] = []

    def build() -> object:
        started.set()
        release.wait(10)
        built.append(object())
        return built[-1]
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(cache.get("slot", 1, build))) for _ in range(8)]
    threads[0].start()
    assert started.wait(10)  # the first is building: the others come while it does
    for t in threads[1:]:
        t.start()
    wait_for(lambda: len(waiting) == 7)
    release.set()
    for t in threads:
        t.join(10)
    assert len(built) == 1 and cache.builds == 1
    assert len(got) == 8 and all(v is built[0] for v in got)


def test_another_version_rebuilds_and_the_slot_keeps_only_the_newest():
    cache: SlotCache[str] = SlotCache(10)
    assert cache.get("s", 1, lambda: "one") == "one"
    assert cache.get("s", 1, lambda: "again") == "one"
    assert cache.get("s", 2, lambda: "two") == "two"
    assert cache.get("s", 1, lambda: "one'") == "one'" and len(cache) == 1


def test_a_failed_build_reaches_every_asker_and_is_not_kept(waiting):
    cache: SlotCache[str] = SlotCache(10)
    started, release = threading.Event(), threading.Event()

    def fail() -> str:
        started.set()
        release.wait(10)
        raise ValueError("no")
    waited: list[BaseException] = []

    def wait() -> None:
        try:
            cache.get("s", 1, lambda: "not asked: it waits for the build under way")
        except ValueError as e:
            waited.append(e)
    first = threading.Thread(target=lambda: pytest.raises(ValueError, cache.get, "s", 1, fail))
    first.start()
    assert started.wait(10)
    other = threading.Thread(target=wait)
    other.start()
    wait_for(lambda: waiting)  # it waits on the build under way (else it would build "ok" itself, later)
    release.set()
    first.join(10)
    other.join(10)
    assert not other.is_alive() and len(waited) == 1
    assert cache.get("s", 1, lambda: "ok") == "ok"


def test_least_recently_used_slots_go_first_past_the_weight():
    cache: SlotCache[int] = SlotCache(10, weigh=lambda v: v)
    cache.get("a", 0, lambda: 4)
    cache.get("b", 0, lambda: 4)
    cache.get("a", 0, lambda: 99)  # a is used again: b is the older
    cache.get("c", 0, lambda: 4)
    assert cache.get("a", 0, lambda: 0) == 4 and cache.get("b", 0, lambda: 0) == 0
    assert cache.get("big", 0, lambda: 11) == 11 and cache.get("big", 0, lambda: 0) == 0  # too big to keep
    assert cache.get("a", 0, lambda: 0) == 4  # and it pushed nothing out
