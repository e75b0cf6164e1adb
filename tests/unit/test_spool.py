"""The worker's spool (workers/spool.py): what is put stays pending until acknowledged, whatever happened between."""

from __future__ import annotations

import os

import workers.spool as spool_mod
from workers.spool import Spool


def result(sid: int) -> dict:
    return {"shape_id": sid, "status": "ok", "us": 1.5, "candidates": [{"name": "c", "us": 1.5}]}


def test_pending_until_acknowledged_in_order_and_the_journal_emptied_then(tmp_path):
    s = Spool(tmp_path)
    ids = [s.put("lease-a", result(i)) for i in range(3)]
    assert [(lid, p["shape_id"]) for _, lid, p in s.pending()] == [("lease-a", 0), ("lease-a", 1), ("lease-a", 2)]
    s.done(ids[1])
    assert [p["shape_id"] for _, _, p in Spool(tmp_path).pending()] == [0, 2]  # a new start sees the same
    s.done(ids[0])
    s.done(ids[2])
    assert s.pending() == [] and os.path.getsize(s.path) == 0


def test_a_torn_append_is_cut_and_the_next_result_is_not_glued_to_it(tmp_path):
    s = Spool(tmp_path)
    s.put("lease-a", result(1))
    with open(s.path, "ab") as f:  # a process killed mid-append
        f.write(b'{"id": "x", "lease_id": "lease-a", "payload": {"shape_')
    later = Spool(tmp_path)  # the next start reads first (deliver_spool), then appends
    assert [p["shape_id"] for _, _, p in later.pending()] == [1]
    later.put("lease-b", result(2))
    assert [(lid, p["shape_id"]) for _, lid, p in Spool(tmp_path).pending()] == [("lease-a", 1), ("lease-b", 2)]


def test_compaction_keeps_the_pending_and_a_twin_process_appends_to_the_new_journal(tmp_path, monkeypatch):
    monkeypatch.setattr(spool_mod, "COMPACT_BYTES", 2000)
    s, twin = Spool(tmp_path, "w1"), Spool(tmp_path, "w2")  # twin: a second process with this spool open
    stuck = s.put("lease-a", result(0))  # never acknowledged (the service keeps failing on it)
    for i in range(1, 40):
        s.done(s.put("lease-a", result(i)))
    before = os.stat(s.path).st_ino
    assert [p["shape_id"] for _, _, p in s.pending()] == [0]  # compacts: a new file renamed over the journal
    assert os.stat(s.path).st_ino != before and os.path.getsize(s.path) < 2000
    twin.put("lease-b", result(99))  # the twin's descriptor still points at the replaced file
    s.put("lease-c", result(100))
    later = Spool(tmp_path, "w3")
    assert [p["shape_id"] for _, _, p in later.pending()] == [0, 99, 100]
    # whose lease each was, through the compaction: a twin delivers it as that worker (workers/agent.py)
    assert [later.owner_of(x) for x in ("lease-a", "lease-b", "lease-c")] == ["w1", "w2", "w1"]
    s.done(stuck)


def test_results_an_older_agent_left_as_files_are_taken_into_the_journal(tmp_path):
    (tmp_path / "00000000000000000001-aaaa.json").write_text('{"lease_id": "lease-a", "payload": {"shape_id": 7}}')
    (tmp_path / "00000000000000000002-bbbb.json").write_text('{"lease_id": "lease-a", "payl')  # torn
    s = Spool(tmp_path)
    assert [(lid, p["shape_id"]) for _, lid, p in s.pending()] == [("lease-a", 7)]
    assert not list(tmp_path.glob("*.json"))
