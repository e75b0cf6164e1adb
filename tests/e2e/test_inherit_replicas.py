"""Image upgrades beside several `serve` replicas on one PostgreSQL (real processes, a PostgreSQL of the test's own):
two inherits racing on two replicas (A <- B on one, B <- A on the other) and one inherit sent to three replicas at
once: one wins, the others answer 409, never a parent cycle nor an image with two parents' campaigns; and an
inherit while the new image's captures and leases arrive: no 5xx but 503, no leased shape carried (its full race's
result stands)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import psycopg
import pytest

from tests.conftest import ADMIN, LiveServer, spawn_server, wait_up
from tests.e2e.test_replicas import stop
from tests.integration.test_leasing_api import ok_row, plausible_us
from tests.private_pg import private_pg  # noqa: F401 - the fixture

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def digest(tag: str) -> str:
    return "sha256:" + (tag * 64)[:64]


def capture(c, digest_: str, ms: range):  # type: ignore[no-untyped-def]
    return c.post("/v1/captures", json={"image_digest": digest_, "gfx": "gfx942", "cu_num": 304,
                                        "family": "bf16_gemm", "host": "h",
                                        "shapes": [{"M": m, "N": 64, "K": 64} for m in ms]})


def lease(c, digest_: str, worker: str, budget_s: float = 80_000, **kw):  # type: ignore[no-untyped-def]
    return c.post("/v1/leases", json={"worker_id": worker, "image_digest": digest_, "gfx": "gfx942", "cu_num": 304,
                                      "backends": ["torch"], "budget_s": budget_s, **kw})


def post_result(c, body: dict, item: dict):  # type: ignore[no-untyped-def]
    us = plausible_us(body, item, 2.0)
    k = f"k{item['shape']['M']}"
    res = ok_row(body, item, us, kernelName=k)
    res.update(kernel_name=k, default_us=us * 2, candidates=[{"name": k, "us": us}, {"name": "torch_linear", "us": us * 2},
                                                             {"name": "r1", "us": us * 1.1}])
    return c.post(f"/v1/leases/{body['lease_id']}/results", json=res)


def tune(c, digest_: str) -> None:
    while (r := lease(c, digest_, "tuner")).status_code == 200:
        body = r.json()
        for item in body["shapes"]:
            res = post_result(c, body, item)
            assert res.status_code == 200, res.text
    assert r.status_code == 204, r.text


def database(pg) -> str:  # type: ignore[no-untyped-def]
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE tuner")
    return pg.url.rsplit("/", 1)[0] + "/tuner"


def start(db_url: str, tmp, n: int) -> list[LiveServer]:  # type: ignore[no-untyped-def]
    first = wait_up(spawn_server(db_url, tmp / "replica-0.log"), timeout=120)  # migrates; the others find it done
    return [first] + [wait_up(spawn_server(db_url, tmp / f"replica-{i}.log"), timeout=120) for i in range(1, n)]


def parents(db_url: str) -> dict[str, str | None]:
    with psycopg.connect(db_url) as conn:
        return dict(conn.execute("SELECT digest, parent_digest FROM images").fetchall())


def at_once(calls: list) -> list:  # type: ignore[type-arg]
    """Each call in a thread of its own, released together; their answers (status codes) in call order."""
    go, out = threading.Barrier(len(calls)), [None] * len(calls)

    def one(i: int) -> None:
        go.wait()
        out[i] = calls[i]()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_racing_inherits_on_replicas_one_wins_the_others_409_never_a_cycle_or_two_parents(private_pg, tmp_path):  # noqa: F811
    db_url = database(private_pg)
    servers = start(db_url, tmp_path, 3)
    clients = [s.client() for s in servers]
    try:
        swapped: Counter = Counter()
        same: Counter = Counter()
        for round_ in range(4):
            a, b, c = digest(f"a{round_}"), digest(f"b{round_}"), digest(f"c{round_}")
            for d in (a, b):  # enough shapes that an inherit takes a while
                assert capture(clients[0], d, range(1, 301)).status_code == 201
            # A <- B on one replica, B <- A on the other, at the same instant
            codes = at_once([lambda: clients[0].post(f"/v1/images/{a}/inherit", json={"from": b}).status_code,
                             lambda: clients[1].post(f"/v1/images/{b}/inherit", json={"from": a}).status_code])
            swapped.update(codes)
            assert sorted(codes) == [201, 409], codes
            # the same inherit C <- A on three replicas at once
            codes = at_once([lambda i=i: clients[i].post(f"/v1/images/{c}/inherit", json={"from": a}).status_code
                             for i in range(3)])
            same.update(codes)
            assert sorted(codes) == [201, 409, 409], codes
            p = parents(db_url)
            assert [p[a], p[b]].count(None) == 1, ("exactly one of the two inherits took", p[a], p[b])
            assert p[c] == a
            with psycopg.connect(db_url) as conn:  # one parent's campaign each: the loser wrote nothing
                for d in (a, b, c):
                    assert conn.execute("SELECT count(*) FROM campaigns WHERE image_digest = %s",
                                        (d,)).fetchone()[0] == 1
        p = parents(db_url)
        for d in p:  # no cycle anywhere: every chain of parents ends
            seen, at = set(), d
            while at is not None:
                assert at not in seen, f"a parent cycle through {d}"
                seen.add(at)
                at = p.get(at)
        print(f"\nswapped inherits on 2 replicas x4: {dict(swapped)}; one inherit on 3 replicas x4: {dict(same)}")
    finally:
        for c in clients:
            c.close()
        stop(servers)


def test_inherit_while_captures_and_leases_arrive_answers_no_5xx_and_carries_no_leased_shape(private_pg, tmp_path):  # noqa: F811
    db_url = database(private_pg)
    servers = start(db_url, tmp_path, 2)
    clients = [s.client() for s in servers]
    old, new = digest("0a"), digest("0b")
    try:
        assert capture(clients[0], old, range(1, 401)).status_code == 201
        tune(clients[0], old)
        # the normal order: the new image's pods capture first (half the shapes now, the rest during the inherit)
        assert capture(clients[0], new, range(1, 201)).status_code == 201
        statuses: Counter = Counter()
        leased: list[tuple[dict, dict, float]] = []  # (lease body, item, when answered)
        lock, stop_ = threading.Lock(), threading.Event()
        window: list[float] = []

        def count(code: int) -> None:
            with lock:
                statuses[code] += 1

        def leaser(i: int) -> None:
            with servers[i % 2].client() as c:
                while not stop_.is_set():
                    r = lease(c, new, f"w{i}", budget_s=60, max_shapes=2)
                    count(r.status_code)
                    if r.status_code == 200:
                        body = r.json()
                        with lock:
                            leased.extend((body, item, time.monotonic()) for item in body["shapes"])

        def capturer() -> None:
            with servers[1].client() as c:
                for lo in range(201, 401, 10):
                    count(capture(c, new, range(lo, lo + 10)).status_code)
                    if stop_.is_set():
                        break

        workers = [threading.Thread(target=leaser, args=(i,)) for i in range(4)] + [threading.Thread(target=capturer)]
        for t in workers:
            t.start()
        # the inherit once leases are being answered (a state, not a sleep)
        while not leased:
            time.sleep(0.01)
        window.append(time.monotonic())
        r = clients[0].post(f"/v1/images/{new}/inherit", json={"from": old})
        window.append(time.monotonic())
        count(r.status_code)
        stop_.set()
        for t in workers:
            t.join()
        assert r.status_code == 201, r.text
        bad = {k: v for k, v in statuses.items() if k >= 500 and k != 503}
        assert not bad, statuses
        # every shape leased for a full race (no incumbent) keeps its own race: not carried, and its result tunes it
        full = [(body, item) for body, item, _t in leased if not item.get("incumbent")]
        during = [t for _b, item, t in leased if window[0] <= t <= window[1]]
        with psycopg.connect(db_url) as conn:
            triaged = {sid: tri for sid, tri in conn.execute(
                "SELECT id, triage FROM shapes WHERE id = ANY(%s)", ([item["shape_id"] for _b, item in full],))}
        carried = [sid for sid, tri in triaged.items() if tri is not None]
        assert not carried, f"{len(carried)} leased shapes were carried by the inherit"
        for body, item in full:
            res = post_result(clients[0], body, item)
            assert res.status_code in (200, 409), res.text  # 409: a lease the sweeper ended meanwhile
        with psycopg.connect(db_url) as conn:
            reraced = conn.execute("SELECT count(*) FROM shapes WHERE id = ANY(%s) AND outcome IS NOT NULL",
                                   ([item["shape_id"] for _b, item in full],)).fetchone()[0]
        assert reraced == 0
        print(f"\ninherit beside captures and leases: {dict(statuses)}; {len(full)} shapes leased for a full race, "
              f"{len(during)} leased during the inherit; carried {r.json()['campaigns'][0]['carried']}")
    finally:
        for c in clients:
            c.close()
        stop(servers)
