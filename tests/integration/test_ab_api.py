"""The serving A/B through a real service process: versions frozen by sha256, a run's passes posted whole,
booking refused while a pass is missing, verdicts per band with the identical-arm control, engagement per rank,
the rollback that withdraws exactly the rows serving the regressing band, promotion, and the promoted version
served by default. The records are synthetic here (seeded, planted effects); tests/e2e/test_ab_gate.py drives
real server processes."""

from __future__ import annotations

import csv
import hashlib
import io
import math
import random

from app.domain import ab_stats
from tests.conftest import CONFIGS, DIGEST, capture
from tests.integration.test_leasing_api import tune_all
from tests.unit.test_ab_gate import hit, miss
from tests.unit.test_ab_stats import records

N = K = 4096
POINTS = [{"concurrency": c, "input_len": 16, "output_len": 32} for c in (2, 8, 32)]
PLANTED = {"c2-i16-o32": -0.03, "c8-i16-o32": 0.0, "c32-i16-o32": 0.08}
# each arm's greedy answers to two prompts: tokens, their logprobs, the runner-up's (ab_wire.Answer)
ANSWERS = [{"tokens": ["Paris", "."], "logprobs": [-0.1, -0.4], "runner_up": [-3.2, -2.5]},
           {"tokens": ["\n", "if"], "logprobs": [-0.2, -1.0], "runner_up": [-2.9, -1.05]}]


CONFIGS_DIR = "/opt/aiter/aiter/configs"  # where the image's AITER keeps its tables, as its worker reports it


def seed_overlay(c, ms=(1, 2, 32, 64), configs_dir: str | None = CONFIGS_DIR):
    """Shapes at these Ms (N = K = 4096) tuned (rows in the overlay), the image's shipped bf16 table reported."""
    default = (CONFIGS / "bf16_tuned_gemm.csv").read_text()
    body = {"tables": {"bf16_tuned_gemm.csv": default}} | ({"configs_dir": configs_dir} if configs_dir else {})
    assert c.put(f"/v1/images/{DIGEST}/tables", json=body).status_code == 200
    r = capture(c, [{"M": m, "N": N, "K": K} for m in ms])
    assert r.status_code == 201
    tune_all(c)
    return r.json()["campaign_id"]


def drive_synthetic(c, run, planted, rng, noise=0.004, ranks=("0", "1"), b_hits=True, skip=(), b_answers=None):
    """What a driver posts: each arm's start log and answers, then every pass of `todo` with its window's log."""
    rid = run["id"]
    for arm in ("A", "A_prime", "B"):
        logs = {r: (hit(2, 2) + hit(32, 32) if arm == "B" and b_hits else miss(2) + miss(32)) for r in ranks}
        answers = b_answers if arm == "B" and b_answers is not None else ANSWERS
        assert c.post(f"/v1/ab/runs/{rid}/arms", json={"arm": arm, "logs": logs, "answers": answers}
                      ).status_code == 200
    t = 0
    for p in run["todo"]:
        if (p["band"], p["repeat"], p["arm"]) in skip:
            continue
        p = {k: p[k] for k in ("band", "repeat", "arm")}
        eff = planted.get(p["band"], 0.0) if p["arm"] == "B" else 0.0
        tok = 1000.0 * (1 + eff) * math.exp(rng.gauss(0, noise))
        recs = [r.model_dump() for r in records(p["arm"], p["band"], p["repeat"], tok, t0=float(t))]
        r = c.post(f"/v1/ab/runs/{rid}/passes", json=dict(p, records=recs, logs={r: "" for r in ranks}))
        assert r.status_code == 201, r.text
        t += 1


def overlay_rows(text):
    return list(csv.DictReader(io.StringIO(text)))


def test_a_run_end_to_end_regression_rollback_rerun_and_promotion(live_server):
    c = live_server.client()
    cid = seed_overlay(c)
    r = c.post("/v1/ab/versions", json={"image_digest": DIGEST})
    assert r.status_code == 201, r.text
    v = r.json()
    assert c.post("/v1/ab/versions", json={"image_digest": DIGEST}).json()["id"] == v["id"]  # same files: same one
    (f,) = v["files"]
    text = c.get(f"/v1/ab/versions/{v['id']}/bf16_gemm.csv").text
    assert hashlib.sha256(text.encode()).hexdigest() == f["sha256"] and f["rows"] == 4
    assert "@overlay" in f["paths"] and len(f["paths"]) >= 2  # the layer: shipped table(s) first, then ours

    body = {"image_digest": DIGEST, "version_id": v["id"], "baseline": "shipped", "points": POINTS, "repeats": 4,
            "requests_per_pass": 8}
    run = c.post("/v1/ab/runs", json=body).json()
    assert run["state"] == "created" and run["passes_total"] == 3 * 4 * 3 and run["arms"]["B"] == v["id"]
    # a band's rounds in the Williams orders (mirrored pairs), then the next band's from the cycle's start
    assert [tuple(p["arm"] for p in run["todo"][k:k + 3]) for k in range(0, 15, 3)] == [
        ("A", "B", "A_prime"), ("A_prime", "B", "A"), ("B", "A_prime", "A"), ("A", "A_prime", "B"),
        ("A", "B", "A_prime")]
    assert run["start_order"][1] == "A" and sorted(run["start_order"]) == ["A", "A_prime", "B"]
    rec = records("A", "c2-i16-o32", 0, 1000.0)
    one = {"band": "c2-i16-o32", "repeat": 0, "arm": "A", "records": [x.model_dump() for x in rec]}
    assert c.post(f"/v1/ab/runs/{run['id']}/passes", json=one).status_code == 409  # not started
    run = c.post(f"/v1/ab/runs/{run['id']}/start").json()
    drive_synthetic(c, run, PLANTED, random.Random(7), skip={("c32-i16-o32", 3, "A")})
    r = c.post(f"/v1/ab/runs/{run['id']}/finish")
    assert r.status_code == 409 and "1 pass(es) not measured yet" in r.json()["detail"]
    got = c.get(f"/v1/ab/runs/{run['id']}").json()
    assert got["state"] == "driving" and got["result"] is None and got["todo"] == [
        {"band": "c32-i16-o32", "repeat": 3, "arm": "A", "n_requests": 32}]  # nothing booked, resumable from the missing pass
    assert got["todo"][0].pop("n_requests") == 32  # at least the band's concurrency
    last = dict(got["todo"][0], records=[x.model_dump() for x in records("A", "c32-i16-o32", 3, 1000.0)])
    assert c.post(f"/v1/ab/runs/{run['id']}/passes", json=last).status_code == 201
    assert c.post(f"/v1/ab/runs/{run['id']}/passes", json=last).status_code == 200  # a re-post: acknowledged
    other = dict(last, records=[x.model_dump() for x in records("A", "c32-i16-o32", 3, 900.0)])
    assert c.post(f"/v1/ab/runs/{run['id']}/passes", json=other).status_code == 409

    booked = c.post(f"/v1/ab/runs/{run['id']}/finish").json()
    res = booked["result"]
    assert booked["state"] == "booked" and res["verdict"] == "regression"
    assert {b["band"]: b["verdict"] for b in res["bands"]} == {
        "c2-i16-o32": "regression", "c8-i16-o32": "neutral", "c32-i16-o32": "gain"}
    assert res["engagement"]["ok"] and [x["rows_hit"] for x in res["engagement"]["ranks"]] == [[1, 2], [1, 2]]
    assert res["accuracy"]["ok"] and res["control_flagged"] == []
    assert "c2-i16-o32 regresses" in res["promotable"]
    assert c.post(f"/v1/ab/runs/{run['id']}/promote").status_code == 409

    rb = c.get(f"/v1/ab/versions/{booked['rollback_version_id']}").json()
    assert rb["parent_id"] == v["id"] and [w["row"]["M"] for w in rb["withdrawn"]] == ["1", "2"]
    kept = overlay_rows(c.get(f"/v1/ab/versions/{rb['id']}/bf16_gemm.csv").text)
    assert sorted(int(x["M"]) for x in kept) == [32, 64]
    assert c.get(f"/v1/ab/versions/{v['id']}").json()["state"] == "rejected"

    run2 = c.post("/v1/ab/runs", json=dict(body, version_id=rb["id"])).json()
    run2 = c.post(f"/v1/ab/runs/{run2['id']}/start").json()
    drive_synthetic(c, run2, {"c32-i16-o32": 0.08}, random.Random(8))
    res2 = c.post(f"/v1/ab/runs/{run2['id']}/finish").json()["result"]
    assert res2["verdict"] == "gain" and res2["promotable"] is None
    prom = c.post(f"/v1/ab/runs/{run2['id']}/promote")
    assert prom.status_code == 200 and prom.json()["state"] == "promoted"

    served = c.get(f"/v1/overlays/{DIGEST}/bf16_gemm.csv")  # the promoted version by default, naming its A/B
    assert served.headers["x-aiter-version"] == str(rb["id"]) and served.headers["x-aiter-ab-run"] == str(run2["id"])
    assert sorted(int(x["M"]) for x in overlay_rows(served.text)) == [32, 64]
    latest = c.get(f"/v1/overlays/{DIGEST}/bf16_gemm.csv", params={"version": "latest"})
    assert latest.headers["x-aiter-version"] == "latest" and len(overlay_rows(latest.text)) == 4
    plan = c.get(f"/v1/overlays/{DIGEST}/bf16_gemm/deploy").json()
    assert plan["version"]["id"] == rb["id"] and plan["version"]["ab_run"] == run2["id"]
    hist = {x["id"]: x for x in c.get("/v1/ab/versions", params={"image_digest": DIGEST}).json()}
    assert [x["verdict"] for x in hist[v["id"]]["runs"]] == ["regression"]
    assert [x["verdict"] for x in hist[rb["id"]]["runs"]] == ["gain"]

    page = c.get(f"/ab/{run['id']}").text  # the dashboard: per band, the control, engagement per rank
    assert 'id="ab-verdict" class="verdict-regression"' in page and "c2-i16-o32" in page
    started = ", ".join(a.replace("_prime", "&#39;") for a in run["start_order"])
    assert f"arms in a Williams order, servers started together in the order {started})" in page
    assert "answer the 2 accuracy prompts as A does (A&#39;: 0 near-tie flip(s), B: 0 near-tie flip(s))" in page
    assert "Tolerance: an answer departs from A's only where A's top two were within 0.1 nats" in page
    assert f"Rollback proposed: version {rb['id']}" in page and 'id="ab-ranks"' in page
    svg = c.get(f"/ab/{run['id']}/bands.svg")
    assert svg.headers["content-type"].startswith("image/svg+xml") and svg.text.count("<circle") == 3
    camp = c.get(f"/campaigns/{cid}").text
    assert 'id="versions"' in camp and f'<a href="/ab/{run2["id"]}">run {run2["id"]}</a>: gain' in camp
    assert f'promoted (run {run2["id"]})' in camp


def test_a_noisy_control_or_an_arm_that_did_not_engage_voids_the_run(live_server):
    c = live_server.client()
    seed_overlay(c)
    v = c.post("/v1/ab/versions", json={"image_digest": DIGEST}).json()
    body = {"image_digest": DIGEST, "version_id": v["id"], "baseline": "shipped", "points": POINTS[:1],
            "repeats": 4, "requests_per_pass": 8}
    run = c.post(f"/v1/ab/runs/{c.post('/v1/ab/runs', json=body).json()['id']}/start").json()
    drive_synthetic(c, run, {}, random.Random(9), b_hits=False)  # B's files did not take: no hit lines
    res = c.post(f"/v1/ab/runs/{run['id']}/finish").json()["result"]
    assert res["verdict"] == "void" and "B did not engage: rank 0 logged no hit line" in res["reason"]
    assert "rank 1" in res["reason"] and c.post(f"/v1/ab/runs/{run['id']}/promote").status_code == 409


def test_an_arm_that_answers_otherwise_voids_the_run_within_the_stated_tolerance(live_server):
    """B's second answer departs from A's at token 1, where A's top two were 0.05 nats apart: a near-tie flip,
    within tolerance (1 of 2 prompts is past the 25% a run may flip, so the flip share voids it); at token 0,
    where A was sure (2.7 nats), the answer changed. The result states the tolerance."""
    c = live_server.client()
    seed_overlay(c)
    v = c.post("/v1/ab/versions", json={"image_digest": DIGEST}).json()
    body = {"image_digest": DIGEST, "version_id": v["id"], "baseline": "shipped", "points": POINTS[:1],
            "repeats": 2, "requests_per_pass": 8}
    cases = {"sure": dict(ANSWERS[1], tokens=["else", "if"]), "tie": dict(ANSWERS[1], tokens=["\n", "elif"]),
             "moved": dict(ANSWERS[1], logprobs=[-0.5, -1.4])}
    got = {}
    for name, second in cases.items():
        run = c.post(f"/v1/ab/runs/{c.post('/v1/ab/runs', json=body).json()['id']}/start").json()
        drive_synthetic(c, run, {}, random.Random(9), b_answers=[ANSWERS[0], second])
        got[name] = c.post(f"/v1/ab/runs/{run['id']}/finish").json()["result"]
    assert got["sure"]["verdict"] == "void" and not got["sure"]["accuracy"]["ok"]
    assert ("accuracy: arm B: 1 prompt(s) answered otherwise than A (first: prompt 1 at token 0; A's top-two gap "
            "2.70 nats > 0.1)") in got["sure"]["reason"]
    assert "accuracy: arm B: 1 of 2 prompts flipped at a near tie (at most 25%)" in got["tie"]["reason"]
    assert "accuracy: arm B: 1 prompt(s) whose tokens' logprobs moved more than 0.1 nats (most: prompt 1, 0.350)" \
        in got["moved"]["reason"]
    assert got["sure"]["accuracy"]["tolerance"] == {"tie_nats": 0.1, "logprob_tol": 0.1, "max_flip_frac": 0.25}
    assert got["sure"]["accuracy"]["prompts"] == 2


def test_bad_input_names_the_field_and_stores_nothing(live_server):
    c = live_server.client()
    seed_overlay(c)
    v = c.post("/v1/ab/versions", json={"image_digest": DIGEST}).json()
    body = {"image_digest": DIGEST, "version_id": v["id"], "points": POINTS, "repeats": 3}
    r = c.post("/v1/ab/runs", json=body)
    assert r.status_code == 422 and "repeats" in r.text
    assert c.post("/v1/ab/runs", json=dict(body, repeats=4, version_id=999)).status_code == 404
    assert c.get("/v1/ab/runs").json() == []
    run = c.post("/v1/ab/runs", json=dict(body, repeats=4)).json()
    c.post(f"/v1/ab/runs/{run['id']}/start")
    bad = {"band": "c99-i1-o1", "repeat": 0, "arm": "A", "records": []}
    r = c.post(f"/v1/ab/runs/{run['id']}/passes", json=bad)
    assert r.status_code == 422 and r.json()["field"] == "band"
    r = c.post(f"/v1/ab/runs/{run['id']}/passes", json=dict(bad, band="c2-i16-o32", repeat=4))
    assert r.status_code == 422 and r.json()["field"] == "repeat"
    assert c.get(f"/v1/ab/runs/{run['id']}").json()["passes_done"] == 0
    assert c.get("/v1/ab/runs/12345").status_code == 404


def test_an_interrupted_run_reads_void_with_its_fault_and_resumes(live_server):
    c = live_server.client()
    seed_overlay(c)
    v = c.post("/v1/ab/versions", json={"image_digest": DIGEST}).json()
    body = {"image_digest": DIGEST, "version_id": v["id"], "baseline": "shipped", "points": POINTS[:1],
            "repeats": 2, "requests_per_pass": 8}
    run = c.post(f"/v1/ab/runs/{c.post('/v1/ab/runs', json=body).json()['id']}/start").json()
    drive_synthetic(c, dict(run, todo=run["todo"][:2]), {}, random.Random(1))
    r = c.post(f"/v1/ab/runs/{run['id']}/interrupt", json={"reason": "arm B's server exited with code -9"}).json()
    assert r["state"] == "interrupted" and r["verdict"] == ab_stats.Verdict.VOID
    assert "arm B's server exited" in r["reason"] and r["passes_done"] == 2
    assert c.post(f"/v1/ab/runs/{run['id']}/finish").status_code == 409
    again = c.post(f"/v1/ab/runs/{run['id']}/start").json()
    assert again["state"] == "driving" and again["fault"] is None and len(again["todo"]) == 4
    drive_synthetic(c, again, {}, random.Random(2))
    assert c.post(f"/v1/ab/runs/{run['id']}/finish").json()["state"] == "booked"


def test_sequential_rounds_measure_on_only_the_undecided_bands_then_book(live_server):
    """repeats 4, up to 12: after 4 rounds the +8% band is decided (a gain) and stops; the noisy neutral band is
    undecided (its MDE above the 2% target) and gets 6 rounds more (one cycle of the round orders), then the 2 left
    to its cap; the run books once no band is
    undecided or each is at the cap, each band's verdict from its own rounds."""
    c = live_server.client()
    seed_overlay(c)
    v = c.post("/v1/ab/versions", json={"image_digest": DIGEST}).json()
    body = {"image_digest": DIGEST, "version_id": v["id"], "baseline": "shipped", "points": [POINTS[1], POINTS[2]],
            "repeats": 4, "requests_per_pass": 8, "max_repeats": 12, "target_mde": 0.02}
    for bad, field in ((dict(body, max_repeats=2), "max_repeats"), (dict(body, max_repeats=9), "max_repeats")):
        r = c.post("/v1/ab/runs", json=bad)
        assert r.status_code == 422 and field in r.text
    run = c.post(f"/v1/ab/runs/{c.post('/v1/ab/runs', json=body).json()['id']}/start").json()
    assert run["passes_total"] == 2 * 4 * 3 and run["rounds"] == {"c8-i16-o32": 4, "c32-i16-o32": 4}
    drive_synthetic(c, run, {"c32-i16-o32": 0.08}, random.Random(21), noise=0.02)
    more = c.post(f"/v1/ab/runs/{run['id']}/finish").json()
    assert more["state"] == "driving" and more["result"] is None and more["extended"] == {"c8-i16-o32": 10}
    assert {(t["band"], t["repeat"]) for t in more["todo"]} == {("c8-i16-o32", k) for k in range(4, 10)}
    assert [t["arm"] for t in more["todo"][:6]] == ["A_prime", "A", "B", "B", "A", "A_prime"]  # the cycle goes on
    late = {"band": "c32-i16-o32", "repeat": 4, "arm": "A", "records": []}
    r = c.post(f"/v1/ab/runs/{run['id']}/passes", json=late)  # the decided band has no round 4
    assert r.status_code == 422 and r.json()["field"] == "repeat"
    t = 1000
    while more["state"] == "driving":
        drive_synthetic(c, more, {"c32-i16-o32": 0.08}, random.Random(t), noise=0.02)
        more, t = c.post(f"/v1/ab/runs/{run['id']}/finish").json(), t + 1
    res = more["result"]
    got = {b["band"]: (b["verdict"], b["rounds"]) for b in res["bands"]}
    assert more["state"] == "booked" and got == {"c8-i16-o32": ("neutral", 12), "c32-i16-o32": ("gain", 4)}
    assert more["rounds"] == {"c8-i16-o32": 12, "c32-i16-o32": 4} and more["passes_done"] == (12 + 4) * 3
    assert "up to 12" in c.get(f"/ab/{run['id']}").text


def test_a_run_s_default_bands_come_from_the_captured_served_load(live_server):
    """No points given: the concurrencies from the tokens-per-step histogram, the input and output lengths the
    served medians of vLLM's prompt and generation length histograms, as the capture agent sent them."""
    c = live_server.client()
    seed_overlay(c)
    v = c.post("/v1/ab/versions", json={"image_digest": DIGEST}).json()
    body = {"image_digest": DIGEST, "version_id": v["id"], "baseline": "shipped", "repeats": 2}
    run = c.post("/v1/ab/runs", json=body).json()
    assert run["points_source"] == "default" and {p["input_len"] for p in run["points"]} == {512}
    bad = capture(c, [], step_buckets={"1": 1}, length_buckets={"prompt": {"ten": 1}})
    assert bad.status_code == 422 and "length_buckets" in bad.text
    r = capture(c, [], step_buckets={"1": 100, "16": 500, "64": 300},
                length_buckets={"prompt": {"100": 10, "200": 30, "500": 10}, "generation": {"50": 20, "100": 30}})
    assert r.status_code == 201, r.text
    run = c.post("/v1/ab/runs", json=body).json()
    assert run["points_source"] == "captured"
    assert [(p["concurrency"], p["input_len"], p["output_len"]) for p in run["points"]] == [
        (1, 150, 58), (16, 150, 58), (64, 150, 58)]
    run = c.post("/v1/ab/runs", json=dict(body, output_len=32)).json()  # a given length overrides the served one
    assert {(p["input_len"], p["output_len"]) for p in run["points"]} == {(150, 32)}


def test_a_layer_version_whose_configs_folder_is_unknown_is_refused(client):
    """The layer's value names the image's own tables; where no worker reported their folder the plan can only
    write a placeholder, and a server handed it would load the overlay without the shipped rows (AITER skips a
    path that does not exist): no such version is made."""
    seed_overlay(client, configs_dir=None)
    r = client.post("/v1/ab/versions", json={"image_digest": DIGEST})
    assert r.status_code == 409 and r.json()["field"] == "form" and "configs folder is unknown" in r.json()["detail"]
    assert client.get("/v1/ab/versions", params={"image_digest": DIGEST}).json() == []  # nothing stored
    merged = client.post("/v1/ab/versions", json={"image_digest": DIGEST, "form": "merged"})
    assert merged.status_code == 201 and merged.json()["files"][0]["paths"] == ["@overlay"]
    seed_overlay(client)  # the folder reported: the layer names real paths
    (f,) = client.post("/v1/ab/versions", json={"image_digest": DIGEST}).json()["files"]
    assert f["paths"][0] == f"{CONFIGS_DIR}/bf16_tuned_gemm.csv" and f["paths"][-1] == "@overlay"


def test_a_small_significant_loss_is_within_margin_and_neither_blocks_nor_rolls_back(live_server):
    """-0.7% at tight noise: significant, so without a margin it regresses and proposes a rollback; under the run's
    default smallest effect of interest (1%) it reads neutral, within margin, and the version is promotable."""
    c = live_server.client()
    seed_overlay(c)
    v = c.post("/v1/ab/versions", json={"image_digest": DIGEST}).json()
    got = {}
    for margin in (0.0, None):
        body = {"image_digest": DIGEST, "version_id": v["id"], "baseline": "shipped", "points": POINTS[:1],
                "repeats": 4, "requests_per_pass": 8} | ({"min_effect": margin} if margin is not None else {})
        run = c.post(f"/v1/ab/runs/{c.post('/v1/ab/runs', json=body).json()['id']}/start").json()
        drive_synthetic(c, run, {"c2-i16-o32": -0.007}, random.Random(3), noise=0.0003)
        got[margin] = c.post(f"/v1/ab/runs/{run['id']}/finish").json()
    strict, default = got[0.0], got[None]
    assert strict["result"]["bands"][0]["verdict"] == "regression" and strict["rollback_version_id"]
    (b,) = default["result"]["bands"]
    assert default["min_effect"] == 0.01 and b["verdict"] == "neutral" and b["reason"].startswith("within margin")
    assert default["rollback_version_id"] is None and default["result"]["promotable"] is None
    assert c.post("/v1/ab/runs", json=dict(body, min_effect=0.7)).json()["field"] == "min_effect"
