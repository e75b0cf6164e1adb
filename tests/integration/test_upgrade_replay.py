"""An image upgrade replayed on AITER's own history (tests/fixtures/aiter-history: shipped tables of consecutive
releases, cut by key, MIT): one release's shipped rows are posted as campaign A's results (through leases, as a
worker would), the next release's tables and kernel catalog are image B's. B inherits A: the triage counts match
a direct diff of the two releases, and no overlay built for B repeats a key B ships."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from pathlib import Path

import pytest

from app.domain.families import get_family
from tests.conftest import DIGEST, OTHER_DIGEST

HISTORY = Path(__file__).resolve().parents[1] / "fixtures" / "aiter-history"
PAIRS = [("v0.1.19", "v0.1.20"), ("v0.1.15", "v0.1.16")]
FAMILIES = ["bf16_gemm", "a8w8_bpreshuffle_gemm"]


def release_files(release: str, fam) -> dict[str, str]:
    """The release's aiter/configs files of the family: path under configs/ -> text."""
    root = HISTORY / release / "aiter" / "configs"
    out = {}
    for p in sorted(root.rglob("*.csv")):
        rel = p.relative_to(root).as_posix()
        name = p.name
        if rel in (fam.tuned_file, fam.untuned_file) or (rel.startswith("model_configs/") and fam.merge_name in name
                                                          and "untuned" not in name):
            out[rel] = p.read_text()
    return out


def tuned_rows(files: dict[str, str], fam) -> list[dict[str, str]]:
    return [r for path, text in files.items() if path != fam.untuned_file
            for r in csv.DictReader(io.StringIO(text))]


def key(fam, untuned: list[str], row: dict[str, str]) -> tuple:
    return (row["gfx"], row["cu_num"], *(row[c] for c in untuned))


def post_as_results(client, fam, rows: list[dict[str, str]], untuned: list[str]) -> list[dict[str, str]]:
    """Capture each row's shape for its identity, lease it and post the row as the winner; the rows the service
    took as verified (a shipped us=0 placeholder, or a time under the device's floor, is refused)."""
    by_id: dict[tuple, list[dict[str, str]]] = {}
    for r in rows:
        by_id.setdefault((r["gfx"], r["cu_num"]), []).append(r)
    taken = []
    for (gfx, cu), group in sorted(by_id.items()):
        text = ",".join(untuned) + "\n" + "".join(",".join(r[c] for c in untuned) + "\n" for r in group)
        r = client.post("/v1/captures", json={"image_digest": DIGEST, "gfx": gfx, "cu_num": int(cu),
                                              "family": fam.name, "untuned_csv": text, "host": "replay"})
        assert r.status_code == 201, r.text
        want = {key(fam, untuned, r): r for r in group}
        while (lz := client.post("/v1/leases", json={"worker_id": "replay", "image_digest": DIGEST, "gfx": gfx,
                                                     "cu_num": int(cu), "backends": ["aiter"], "budget_s": 80_000,
                                                     "families": [fam.name]})).status_code == 200:
            body = lz.json()
            for item in body["shapes"]:
                shape = item["shape"]
                row = want[(gfx, cu, *(shape[c] for c in untuned))]
                us = float(row["us"] or 0)
                res = {"shape_id": item["shape_id"], "backend": "aiter", "status": "ok", "row": row,
                       "us": us if us > 0 else None, "err_ratio": float(row.get("errRatio") or row.get("err_ratio")
                                                                        or 0),
                       "kernel_name": fam.kernel_of(row), "elapsed_s": 1.0}
                got = client.post(f"/v1/leases/{body['lease_id']}/results", json=res)
                if got.status_code == 200 and got.json()["verified"]:
                    taken.append(row)
                elif got.status_code == 200:  # not verified: report it failed so the shape leaves the queue
                    pass
    return taken


@pytest.mark.parametrize("old, new", PAIRS)
@pytest.mark.parametrize("family", FAMILIES)
def test_an_upgrade_replayed_on_aiters_history_triages_as_a_direct_diff_and_repeats_no_shipped_key(
        client, family, old, new):
    fam = get_family(family)
    old_files, new_files = release_files(old, fam), release_files(new, fam)
    untuned = next(csv.reader(io.StringIO(old_files[fam.untuned_file])))
    # A runs the old release: its header (default table header-only: A ships nothing of its own here)
    header = old_files[fam.tuned_file].splitlines()[0] + "\n"
    assert client.put(f"/v1/images/{DIGEST}/tables", json={
        "tables": {fam.tuned_file: header, fam.untuned_file: old_files[fam.untuned_file]}}).status_code == 200
    taken = post_as_results(client, fam, tuned_rows(old_files, fam), untuned)
    assert taken, "some of the old release's rows are verified results of A"
    catalog = json.loads((HISTORY / new / "kernels.json").read_text())[family]
    r = client.put(f"/v1/images/{OTHER_DIGEST}/tables", json={"tables": new_files, "kernels": {family: catalog}})
    assert r.status_code == 200, r.text
    r = client.post(f"/v1/images/{OTHER_DIGEST}/inherit", json={"from": DIGEST})
    assert r.status_code == 201, r.text
    got = Counter()
    for camp in r.json()["campaigns"]:
        got.update({k: camp[k] for k in ("carried", "now_shipped", "kernel_gone", "header_changed")})

    # the direct diff: a key the new release ships is never carried; else its kernel decides
    shipped = {key(fam, untuned, r): r for r in tuned_rows(new_files, fam)}
    want = Counter()
    same = 0
    for row in taken:
        k = key(fam, untuned, row)
        if k in shipped:
            want["now_shipped"] += 1
            same += fam.kernel_of(shipped[k]) == fam.kernel_of(row)
        elif all(x in catalog for x in fam.kernel_of(row).split("+")):
            want["carried"] += 1
        else:
            want["kernel_gone"] += 1
    assert {k: got[k] for k in ("carried", "now_shipped", "kernel_gone", "header_changed")} == \
        {k: want[k] for k in ("carried", "now_shipped", "kernel_gone", "header_changed")}
    cid = r.json()["campaigns"][0]["campaign_id"]
    up = client.get(f"/v1/campaigns/{cid}").json()["upgrade"]
    assert sum(c["carried"] for c in r.json()["campaigns"]) >= up["provisional"]
    # the rows B ships with our very kernel need no race: covered at once
    covered = sum(client.get(f"/v1/campaigns/{c['campaign_id']}").json()["covered"] for c in r.json()["campaigns"])
    assert covered == same

    # no overlay for B repeats a key B ships, in any deploy form; every carried row is in it
    for form in ("layer", "model_configs_dropin"):
        ov = client.get(f"/v1/overlays/{OTHER_DIGEST}/{family}.csv", params={"version": "latest", "form": form})
        assert ov.status_code == 200, ov.text
        rows = list(csv.DictReader(io.StringIO(ov.text)))
        assert not [x for x in rows if key(fam, untuned, x) in shipped]
        assert len(rows) == want["carried"]
    plan = client.get(f"/v1/overlays/{OTHER_DIGEST}/{family}/deploy").json()
    assert "layer" in plan["offered"], plan["notes"]
    print(f"\nreplay {family} {old} -> {new}: {len(taken)} rows of A verified; triage {dict(got)}; "
          f"{same} shipped with the same kernel (covered, no race)")


RENAMES = HISTORY / "renames"


@pytest.mark.parametrize("family, old, new", [("a8w8_blockscale_gemm", "v0.1.9", "v0.1.10"),
                                              ("a8w8_bpreshuffle_gemm", "v0.1.14", "v0.1.15"),
                                              ("fmoe", "v0.1.5", "v0.1.6")])
def test_an_upgrade_across_a_kernel_rename_carries_the_renamed_rows_under_their_new_names(client, family, old, new):
    """AITER renamed kernels without changing them (v0.1.10's blockscale CK names gained a field, v0.1.15's FlyDSL
    bpreshuffle names another, v0.1.6's CK MoE names the row's quant type by number and its dtypes): the old release's rows posted as image A's results, image B has the new release's
    catalog (tests/fixtures/aiter-history/renames: real shipped rows of both releases, cut): a row whose kernel B
    has under its new name is carried, served and confirmed under that name, not raced again."""
    fam = get_family(family)
    old_rows = list(csv.DictReader(io.StringIO((RENAMES / family / f"{old}.csv").read_text())))
    new_rows = {key(fam, list(fam.untuned_header), r): r
                for r in csv.DictReader(io.StringIO((RENAMES / family / f"{new}.csv").read_text()))}
    catalog = json.loads((RENAMES / family / "kernels.json").read_text())
    untuned = list(fam.untuned_header)
    header = ",".join(fam.tuned_header) + "\n"
    for digest in (DIGEST, OTHER_DIGEST):  # neither image ships these keys: the rows are ours to carry or race
        assert client.put(f"/v1/images/{digest}/tables", json={
            "tables": {fam.tuned_file: header, fam.untuned_file: ",".join(untuned) + "\n"},
            **({"kernels": {family: catalog}} if digest == OTHER_DIGEST else {})}).status_code == 200
    taken = post_as_results(client, fam, old_rows, untuned)
    def theirs(r: dict[str, str]) -> str:  # the new release's kernel (fmoe's: both stages, joined by '+')
        return fam.kernel_of(new_rows[key(fam, untuned, r)])

    renamed = [r for r in taken if theirs(r) != fam.kernel_of(r)
               and fam.catalog_name(fam.kernel_of(r), set(theirs(r).split("+")), r) == theirs(r)]
    assert len(renamed) >= 10, ("the fixture holds renamed rows verified as A's results", len(taken), len(old_rows))
    want_carried = sum(all(any(f in catalog for f in fam.kernel_forms(p, r)) for p in fam.kernel_of(r).split("+"))
                       for r in taken)
    r = client.post(f"/v1/images/{OTHER_DIGEST}/inherit", json={"from": DIGEST})
    assert r.status_code == 201, r.text
    got = Counter()
    for camp in r.json()["campaigns"]:
        got.update({k: camp[k] for k in ("carried", "kernel_gone")})
    assert got["carried"] == want_carried and got["carried"] >= len(renamed), (dict(got), len(renamed))
    assert got["kernel_gone"] == len(taken) - want_carried
    # served under the new name (AITER v0.1.15 parses a FlyDSL name; an old-format one falls back to its default)
    served = {key(fam, untuned, x): fam.kernel_of(x)
              for x in csv.DictReader(io.StringIO(client.get(f"/v1/overlays/{OTHER_DIGEST}/{family}.csv", params={"version": "latest"}).text))}
    for row in renamed:
        assert served[key(fam, untuned, row)] == theirs(row)
    print(f"\nrename replay {family} {old} -> {new}: {len(taken)} rows of A verified, {len(renamed)} renamed; "
          f"triage {dict(got)}")
