"""The service's per-shape verdict against AITER's own code, on what the deploy plan deploys.

For each family x identity x FlyDSL x release, an overlay is made the way the service makes one (rows in the
image's header for a deterministic sample of AITER's own shipped shape lists plus random shapes, at both
identities), every deploy form is built by the service (app/domain/deploy.py), and then deployed into a copy
of that release's aiter/configs tree: the ':'-joined env value, the merged file, the model_configs drop-in.
AITER's resolution, merge and lookups then run (tests/differential/aiter_exec.py) and must agree shape by shape:
a form the service refuses must make AITER raise; an offered one must not, and every hit/miss and the row used
must be the same. Shapes are sampled (seeded) to keep the run to about a minute; the counts are printed.
"""

from __future__ import annotations

import csv
import io
import random
import re
import shutil
from pathlib import Path

import pytest

from app.domain import deploy
from app.domain import engagement as eng
from app.domain.capture_parsing import from_untuned_csv
from app.domain.families import CURRENT, RELEASE_0_1_7, get_family, lookup_identity
from app.domain.headers import parse_header_line, tuned_schema
from app.domain.keys import m_candidates
from app.domain.log_lines import parse_log
from app.domain.shapes import ShapeError, make_shape
from app.domain.tables import Table, read_table, render_csv
from app.domain.families import FAMILIES as ALL_FAMILIES
from tests.conftest import CONFIGS, OLD_AITER, aiter_tree_with
from tests.differential import aiter_exec as ax
from tests.differential.sources import old_release_tree

# every family whose lookup AITER has in Python (TableFamily.aiter_lookup)
FAMILIES = tuple(n for n, f in ALL_FAMILIES.items() if f.aiter_lookup)
IDENTITIES = (("gfx942", 304), ("gfx950", 256))
SHIPPED_SAMPLE, RANDOM_SAMPLE = 160, 60
RESULTS: list[tuple] = []


def _releases():
    """Both releases, always: one whose sources cannot be had fails each of its tests (never a silent skip)."""
    old = old_release_tree()
    return [("current", CURRENT, None, None, CONFIGS),  # the tree is picked per family
            ("0.1.7", RELEASE_0_1_7, old, old and old / "aiter_meta" / "csrc", old and old / "aiter" / "configs")]


RELEASES = _releases()


def tree_with(*rels: str) -> Path:
    """The current release's sources holding rels, or the test FAILS: a missing source is never a pass nor a skip."""
    try:
        return aiter_tree_with(*rels)
    except pytest.skip.Exception as e:
        pytest.fail(f"AITER's current sources are needed and not found: {e}")


def _untuned_files(configs: Path, family) -> list[Path]:
    stem = family.untuned_file.removesuffix(".csv")
    out = [configs / family.untuned_file] if (configs / family.untuned_file).exists() else []
    mc = configs / "model_configs"
    if mc.exists():
        out += sorted(p for p in mc.glob("*.csv") if "untuned" in p.name and
                      (stem in p.name or family.merge_name.replace("tuned", "untuned") in p.name
                       or (family.name == "bf16_gemm" and "untuned_gemm_bf16" in p.name)))
    return out


def _tuned_files(configs: Path, family) -> list[Path]:
    out = [configs / family.tuned_file] if (configs / family.tuned_file).exists() else []
    return out + sorted(p for p in (configs / "model_configs").glob(f"*{family.merge_name}*.csv")
                        if "untuned" not in p.name)


def _rows(p: Path) -> list[dict[str, str]]:
    return [{k.strip(): (v or "").strip() for k, v in r.items() if k}
            for r in csv.DictReader(io.StringIO(p.read_text()))]


def shipped_shapes(configs: Path, family) -> list[dict[str, str]]:
    """AITER's own shape lists: its untuned files; a family that ships none (mxscale BMM) has the shapes of its
    tuned tables."""
    shapes: dict[str, dict[str, str]] = {}
    untuned = [p for p in _untuned_files(configs, family) if _rows(p)
               and set(family.shape_columns) <= set(parse_header_line(p.read_text().splitlines()[0]))]
    for p in untuned or _tuned_files(configs, family):
        header = parse_header_line(p.read_text().splitlines()[0])
        rows = _rows(p)
        if (family.m_column and family.m_column not in header) or not rows:
            continue
        keep = [c for c in family.shape_columns if c in header]
        body = render_csv(tuple(keep), rows)
        for s, _n in from_untuned_csv(family, body).shapes.values():
            shapes.setdefault(s.key, s.as_dict())
    return list(shapes.values())


def random_shapes(family, base: list[dict[str, str]], rng: random.Random, gfx: str) -> list[dict[str, str]]:
    """Random M on AITER's own N/K (and B), bias on and off, int8 and the GPU's fp8 weights."""
    fp8 = "torch.float8_e4m3fnuz" if gfx == "gfx942" else "torch.float8_e4m3fn"
    out = []
    for _ in range(RANDOM_SAMPLE):
        s = dict(rng.choice(base))
        if family.m_column:
            s[family.m_column] = str(rng.choice([rng.randint(1, 300), rng.randint(1, 20000)]))
        else:  # GDN: a batch shape's chunk counts and flags, as a call makes them (dense: whole sequences of
            # max_seq_chunks; varlen: at least the longest sequence)
            most = int(s["max_seq_chunks"])
            more = most * rng.randint(1, 8) if s["is_varlen"] == "False" else most + rng.randint(0, 64)
            s["total_chunks"] = str(rng.choice([int(s["total_chunks"]), more]))
            s["use_h0"] = rng.choice(["True", "False"])
        if "bias" in s:
            s["bias"] = rng.choice(["True", "False"])
        if "q_dtype_w" in s and family.m_column == "M":
            s["q_dtype_w"] = rng.choice(["torch.int8", fp8])
        if "shared_expert_id" in s:  # a capture's own value; fhmoe's lookup keys on expert - 1
            s["shared_expert_id"] = rng.choice([s["shared_expert_id"], "0"])
        out.append(s)
    return out


def result_pool(configs: Path, family) -> list[dict[str, str]]:
    """The result cells of AITER's own shipped rows: real kernel names, ids and libtypes (the batched lookups
    parse the kernel name; the op dispatches on the libtype)."""
    keys = set(family.key_columns) | set(family.shape_columns) | {"gfx", "cu_num"}
    return [{c: v for c, v in r.items() if c not in keys} | ({"_kind": moe_kind(r)} if family.moe_op else {})
            for p in _tuned_files(configs, family) for r in _rows(p)]


# a MoE row's kernels are of one kind of call (a tuner writes kernels of the shape's quant/dtypes): the rows
# made for a shape take their result cells from shipped rows of its kind where there are any
MOE_KIND = ("act_type", "dtype", "q_dtype_a", "q_dtype_w", "q_type", "use_g1u1", "doweight_stage1")


def moe_kind(cells: dict[str, str]) -> tuple[str, ...]:
    return tuple(str(cells.get(c, "")) for c in MOE_KIND)


def result_cells(family, pool: list[dict[str, str]], rng: random.Random) -> dict[str, str]:
    cells = dict(rng.choice(pool))
    us = f"{rng.uniform(1, 50):.4f}"
    for c in ("us", "us1", "us2"):
        if c in cells:
            cells[c] = us
    cells["_tag"] = ""
    return cells


def overlay_for(family, header: tuple[str, ...], shapes: list[dict[str, str]], rng: random.Random,
                pool: list[dict[str, str]], idents=IDENTITIES) -> Table:
    """Rows the service would emit: captured values remapped, at the raw M or one AITER pads to, at both
    identities (one overlay per image digest carries every identity it was tuned on)."""
    rows, seen = [], set()
    for i, s in enumerate(shapes):
        if rng.random() < 0.35:
            continue
        for gfx, cu in idents:
            if rng.random() < 0.3:
                continue
            kin = [p for p in pool if p.get("_kind") == moe_kind(family.remap(s))] if family.moe_op else []
            cells = dict(result_cells(family, kin or pool, rng), **family.remap(s), gfx=gfx, cu_num=str(cu))
            if (family.aiter_op or family.op_entries) and random.Random(f"{i}{gfx}").random() < 0.2:
                # libtypes the op may not run (or whose solfunc asserts on this call)
                cells["libtype"] = random.Random(i).choice(("asm", "triton", "opus", "flydsl", "hipblaslt", "torch",
                                                            "skinny"))
            cands = m_candidates(family, s)
            if cands:
                cells[family.m_column] = str(rng.choice(cands))
            if gfx == "gfx950" and "fnuz" in cells.get("q_dtype_w", ""):
                cells["q_dtype_w"] = "torch.float8_e4m3fn"
            key = tuple(cells.get(c, "") for c in family.key_columns)
            if key in seen:
                continue
            seen.add(key)
            rows.append({c: cells.get(c, "") for c in header})
    return Table(header, rows, "svc_0123456789ab_" + family.tuned_file)


def sandbox(tmp: Path, configs: Path, family, release) -> Path:
    root = tmp / "tree"
    if root.exists():
        shutil.rmtree(root)
    dst = root / "aiter" / "configs"
    (dst / "model_configs").mkdir(parents=True)
    for p in configs.glob("*.csv"):
        shutil.copy(p, dst / p.name)
    for p in (configs / "model_configs").glob("*.csv"):
        if family.merge_name in p.name or "untuned" in p.name:
            shutil.copy(p, dst / "model_configs" / p.name)
    return root


def shipped_of(root: Path, family, release) -> deploy.Shipped:
    """What a worker in this image reports: the default, model_configs in AITER's glob order, the untuned header."""
    cfg = root / "aiter" / "configs"
    d = cfg / release.default_file(family)
    default = read_table(d.read_text(), d.name) if d.exists() else None
    mcs = [read_table(p.read_text(), f"model_configs/{p.name}")
           for p in (cfg / "model_configs").glob(f"*{family.merge_name}*{release.model_configs_suffix}")
           if p.is_file() and "untuned" not in p.name]
    u = cfg / family.untuned_file
    return deploy.Shipped(default, mcs, parse_header_line(u.read_text().splitlines()[0]) if u.exists() else None,
                          True)


def same_error(refused: str, aiter_error: str) -> bool:
    """A refusal names the error AITER raises: the exception class AITER raised appears in it, as
    'ClassName:' (not any error: a refusal for a duplicate key is not AITER failing on a missing file)."""
    kind = aiter_error.split(":", 1)[0].strip()
    return re.search(rf"\b{re.escape(kind)}:", refused) is not None


def same_row(family, cfg: dict, row: dict) -> bool:
    cols = [c for c in ("kernelName", "kernelName1", "kernelName2", "kernelId", "splitK", "libtype", "us", "BV")
            if c in row and c in cfg]

    def norm(v):
        if v is None or v != v or v == "":  # pandas reads an empty cell as NaN
            return ""
        try:
            return float(v)
        except (TypeError, ValueError):
            return str(v)
    return all(norm(cfg.get(c)) == norm(row.get(c)) for c in cols)


@pytest.mark.parametrize("flydsl", [True, False], ids=["flydsl", "no-flydsl"])
@pytest.mark.parametrize("ident", IDENTITIES, ids=lambda x: f"{x[0]}-{x[1]}")
@pytest.mark.parametrize("family_name", FAMILIES)
@pytest.mark.parametrize("rel", RELEASES, ids=[r[0] for r in RELEASES])
def test_service_verdict_equals_aiter_per_shape(rel, family_name, ident, flydsl, tmp_path):
    compare(rel, family_name, ident, flydsl, tmp_path)


@pytest.mark.parametrize("env", ({}, {"CU_NUM": "80"}, {"GPU_ARCHS": "gfx942;gfx1250"}, {"GPU_ARCHS": "gfx942"}),
                         ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()) or "unset")
@pytest.mark.parametrize("flydsl", [True, False], ids=["flydsl", "no-flydsl"])
def test_grouped_fmoe_on_its_own_gpu(flydsl, env, tmp_path):
    """grouped fmoe runs on gfx1250 only (grouped_moe_gfx1250.py _use_grouped_gemm_enabled) and ships only its
    rows: the other identities would find nothing."""
    current = RELEASES[0]
    compare(current, "grouped_fmoe", ("gfx1250", 256), flydsl, tmp_path, env=env)


# The serving environment's GPU_ARCHS and CU_NUM (chip_info.py, build_targets.py): unset, "native", the GPU's
# own arch, a ';' list (its last entry), one with a space, empty, another arch; CU_NUM another part's, 0, junk.
ENVS = ({}, {"GPU_ARCHS": "native"}, {"GPU_ARCHS": "@gpu"}, {"GPU_ARCHS": "gfx942;gfx950"},
        {"GPU_ARCHS": "gfx950;gfx942"}, {"GPU_ARCHS": "gfx942; gfx950"}, {"GPU_ARCHS": ""},
        {"CU_NUM": "80"}, {"CU_NUM": "0"}, {"GPU_ARCHS": "@gpu", "CU_NUM": "80"}, {"CU_NUM": "x"})
# one family per way AITER reads the identity: get_gfx() (bf16), get_gfx_runtime + the compiled table's build
# targets (a8w8: own padding; bpreshuffle: getPaddedM, ck rows; batched), gfx backfilled from cu_num (fmoe)
ENV_FAMILIES = ("bf16_gemm", "a8w8_gemm", "a8w8_bpreshuffle_gemm", "a8w8_batched_gemm", "fmoe", "gdn_k5_opt")


@pytest.mark.parametrize("env", ENVS, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()) or "unset")
@pytest.mark.parametrize("ident", IDENTITIES, ids=lambda x: f"{x[0]}-{x[1]}")
@pytest.mark.parametrize("family_name", ENV_FAMILIES)
def test_service_reads_gpu_archs_and_cu_num_as_aiter_does(family_name, ident, env, tmp_path):
    current = RELEASES[0]
    env = {k: v.replace("@gpu", ident[0]) for k, v in env.items()}
    compare(current, family_name, ident, True, tmp_path, env=env, only_form="layer", n=(60, 20))


def compare(rel, family_name, ident, flydsl, tmp_path, env: dict | None = None, only_form: str | None = None,
            n: tuple[int, int] = (0, 0), case=None, label: str | None = None) -> None:
    """Deploy the service's overlay for this family in every form (or only_form) into a copy of the release's
    tree, run AITER there with this GPU, FlyDSL setting and serving environment, and compare per shape.
    case(family, header, shapes, result pool) -> (shapes, overlay): crafted shapes and rows instead."""
    rel_name, release, src, csrc, configs = rel
    if configs is None:
        pytest.fail(f"AITER {rel_name} could not be fetched ({OLD_AITER} from the package registry): its verdicts "
                    "are not checked")
    env = env or {}
    family = release.family(family_name)
    if family_name in release.lookup_unused:
        pytest.skip(f"{rel_name}: the {family_name} op only logs its Python lookup; its compiled table decides")
    if not _tuned_files(configs, family):
        pytest.skip(f"{rel_name} ships no {family_name} table")
    if src is None:  # the current release: the first local tree with the lookup (conftest)
        cpp = [f"csrc/{family.tuner_script.split('/')[1]}"] if family.cpp_key and family.tuner_script else []
        src = tree_with(family.aiter_lookup.split(":")[0], *cpp, *(family.moe_op.sources if family.moe_op else ()),
                        *family.op_sources)
        csrc = src / "csrc"
    gfx, cu = ident
    rng = random.Random(f"{rel_name}-{family_name}")  # the same overlay for every identity and FlyDSL setting
    try:
        shipped_all = shipped_shapes(configs, family)
    except ShapeError:  # 0.1.7's a8w8 list has no q_dtype_w: take the current list's shapes
        shipped_all = []
    shipped_all = shipped_all or shipped_shapes(CONFIGS, family)
    shapes = sorted(shipped_all, key=lambda s: str(sorted(s.items())))
    shapes = random.Random(1).sample(shapes, min(n[0] or SHIPPED_SAMPLE, len(shapes)))
    shapes += random_shapes(family, shapes, random.Random(2), gfx)[:n[1] or RANDOM_SAMPLE]
    if family.m_column == "M" and "q_dtype_w" in family.shape_columns and "q_dtype_w" not in family.aiter_args:
        shapes = [{k: v for k, v in s.items() if k != "q_dtype_w"} | {"q_dtype_w": "torch.int8"} for s in shapes]
    header = parse_header_line(_tuned_files(configs, family)[0].read_text().splitlines()[0])
    schema = tuned_schema(get_family(family_name), header)
    overlay = overlay_for(family, header, shapes, rng, result_pool(configs, family),
                          IDENTITIES + ((ident,) if ident not in IDENTITIES else ()))
    if case is not None:
        shapes, overlay = case(family, header, shapes, result_pool(configs, family))
    wr = family.weight_retry  # the probe calls the op with a weight of the activation's K unless a shape says
    probed = [s if wr is None or wr.cell in s else {**s, wr.cell: s[wr.column]} for s in shapes]  # another: so does
    ident_x = ax.Identity(gfx, cu, flydsl, env)  # the service (a capture's shape has no weight_K: unknown)
    env_of_server = env  # what a capture's env carries (env is the deploy's table path below)
    li = lookup_identity(family, gfx, cu, env)  # how the service reads the serving environment
    if family.moe_op is not None and len(family.moe_op.call_variants) > 1:  # the probe makes the first call that
        # derives the captured q_dtype_a (a capture does not say which: the service's verdict is unknown where they
        # differ); the service is told that call, so each verdict is checked against AITER's
        probed = [{**s, **family.moe_op.variant(family.remap(eng.with_env(family, s, env)), gfx, li.arch)}
                  for s in probed]
    env_error = "; ".join(e for e in (li.error, li.build_error if family.compiled else None) if e) or None
    where = f"{gfx}/{cu}" + "".join(f" {k}={v!r}" for k, v in env.items())
    forms = {}
    root = sandbox(tmp_path, configs, family, release)
    shipped = shipped_of(root, family, release)
    arts = deploy.artifacts(release, family, shipped, overlay, gfx, schema.key_columns)
    forms = {f: (a, a.overlay or overlay) for f, a in arts.items() if only_form in (None, f)}
    # where the plan deploys the overlay without the shipped keys, the full one must make AITER raise
    if arts["layer"].full_refused and only_form is None:
        forms["layer_full_overlay"] = (deploy.build(release, family, "layer", shipped, overlay, gfx), overlay)
    disagreements = []
    for form, (art, ov) in forms.items():
        root = sandbox(tmp_path, configs, family, release)
        cfg = root / "aiter" / "configs"
        ovdir = root / "overlays"
        ovdir.mkdir()
        if form == "merged":
            if art.table is None:
                continue
            (ovdir / art.files[0]).write_text(render_csv(art.table.header, art.table.rows))
            env = str(ovdir / art.files[0])
        elif form == "model_configs_dropin":
            (cfg / "model_configs" / ov.name).write_text(render_csv(ov.header, ov.rows))
            env = None
        else:
            (ovdir / ov.name).write_text(render_csv(ov.header, ov.rows))
            paths = [str(ovdir / n) if n == ov.name else str(cfg / n) for n in art.files]
            env = ":".join(paths)
        out = ax.run(src, csrc, rel_name, root, family, env, ident_x, probed)
        aiter_fails = out.error or out.lookup_error
        mine = None if art.table is None or art.refused else eng.check(
            family, schema.key_columns, li.gfx, li.cu_num, probed, art.table, flydsl=flydsl, cpp_at=(gfx, cu),
            build_targets=li.build_targets, arch=li.arch, env=env_of_server)
        refused = art.refused or env_error
        if mine and aiter_fails and all(m.verdict == "raises" for m in mine) and len({m.reason for m in mine}) == 1:
            refused = refused or mine[0].reason  # the op raises on every call (OpPath): read as the loader's by run()
        if mine and li.miss_error:  # a shape without a row takes a default path that raises (as verdicts() has it)
            for m in mine:
                if not m.hit:
                    m.fails = True
            if all(not m.hit for m in mine):  # every shape raises the same: the harness reads it as the loader's
                refused = refused or li.miss_error
        if refused is not None or aiter_fails:
            RESULTS.append((label or family_name, form, where, flydsl, rel_name, len(shapes),
                            "refused" if refused else "offered", "raises" if aiter_fails else "loads"))
            if bool(refused) != bool(aiter_fails) or (refused and not same_error(refused, aiter_fails)):
                disagreements.append(f"{form}: service refused={refused!r}, AITER error={aiter_fails!r}, "
                                     f"rewrote={out.rewritten}")
            if art.refused and form == "layer_full_overlay" and release.merge_on_duplicate == "raise_rewrite":
                assert out.rewritten, "AITER rewrites the shipped files before raising"
                # the files it rewrote (each that lost a row to a lower us elsewhere) are the ones the service names
                assert sorted(Path(p).name for p in out.rewritten) == sorted(Path(n).name for n in art.rewritten)
            continue
        assert not out.rewritten, (form, out.rewritten)

        theirs = out.verdicts
        if rel_name == "current":
            # a shape AITER raised on may log its lookup or not (tuned_gemm.py:208 asserts before :232 logs; an op
            # raises after its lookup logged): its lines are read, not required; a MoE stage launcher's 'not find
            # kernel' comes after its lookup logged (a hit line, read as one)
            kept = [i for i, r in enumerate(out.raised) if r is None or r.startswith("KernelNotFound")]
            disagreements += log_disagreements(family, [shapes[i] for i in kept],
                                               [theirs[i] if out.raised[i] is None else (False, {"kernelName1": ""})
                                                for i in kept], out.log, gfx,
                                               [s for i, s in enumerate(shapes) if i not in set(kept)], li.arch,
                                               env_of_server)[:4]
        bad = 0
        for s, m, (h, c), raised in zip(shapes, mine, theirs, out.raised):
            if m.verdict == "unknown":  # it depends on what the check is not given (another table): counted
                assert "another table" in m.reason, m.reason  # the harness gives it all else (weight_K, the call)
                continue
            # a row AITER's lookup returned (used or not) must be the row the service found; a shape AITER
            # raises on must be predicted to raise (a third verdict, not a miss)
            found = c is not None and ("us" in c or "kernelName1" in c)
            verdict = "raises" if raised else "hit" if h else "miss"
            if m.verdict != verdict and not (verdict == "miss" and m.verdict == "raises" and m.row is not None):
                bad += 1
                if len(disagreements) < 8:
                    disagreements.append(f"{form} {s}: service {m.verdict} ({m.reason}), AITER {verdict} "
                                         f"({raised})")
            elif m.hit != h or ((h or (found and m.row is not None)) and not same_row(family, c, m.row or {})):
                bad += 1
                if len(disagreements) < 8:
                    disagreements.append(f"{form} {s}: service hit={m.hit} ({m.reason or (m.row or {}).get('us')}) "
                                         f"AITER hit={h} row={None if c is None else {k: c.get(k) for k in ('us', 'kernelName', 'kernelName1', 'kernelId')}}")
        RESULTS.append((label or family_name, form, where, flydsl, rel_name, len(shapes),
                        f"hits {sum(x.hit for x in mine)}", f"raises {sum(x.verdict == 'raises' for x in mine)}",
                        f"unknown {sum(x.verdict == 'unknown' for x in mine)}",
                        f"disagree {bad}"))
    assert not disagreements, "\n".join(disagreements)


def log_disagreements(family, shapes: list[dict], theirs: list, log: list[str], gfx: str,
                      raised: list[dict] = (), arch: str | None = None, env: dict | None = None) -> list[str]:
    """AITER's own log lines of these lookups (AITER_LOG_TUNED_CONFIG=1), read with the service's grammar
    (TableFamily.log_lines): every line is this family's and names a shape probed (as AITER printed it: MoE
    prints its padded token), a hit exactly where AITER's lookup returned a row; every call that found a row (a
    GEMM's: every call) logged one (AITER's lookups are cached per call)."""
    printed: dict[tuple, bool] = {}
    wr = family.weight_retry
    if wr is not None:  # a padded weight's call logs its lookup at K, then maybe at the weight's K: read, not required
        plain = [i for i, s in enumerate(shapes) if s.get(wr.cell, s[wr.column]) == s[wr.column]]
        raised = [{k: v for k, v in x.items() if k != wr.cell} for s in list(raised) + [s for i, s in
                  enumerate(shapes) if i not in plain] for x in (s, {**s, wr.column: s.get(wr.cell, s[wr.column])})]
        shapes, theirs = [{k: v for k, v in shapes[i].items() if k != wr.cell} for i in plain], [theirs[i]
                                                                                                 for i in plain]
    for s, (_, c) in zip(shapes, theirs):
        found = c is not None and ("us" in c or "kernelName1" in c)
        # as the op hands it to the lookup (under the serving environment), which prints it
        s = {k: v for k, v in family.looked_up(eng.with_env(family, s, env), gfx, arch).items() if k in s}
        s.update({c: str(int(s[src]) + off) for c, src, off in family.lookup_derived})  # as the lookup keys it
        for m in (m_candidates(family, s) if family.m_column == "token" else [None]):
            printed[make_shape(family, s if m is None else dict(s, token=str(m)), "probe").key] = found
    maybe = {make_shape(family, {k: v for k, v in family.looked_up(eng.with_env(family, s, env), gfx, arch).items()
                                 if k in s}, "probe").key for s in raised} - set(printed)
    events = parse_log("\n".join(log)).events
    if not family.log_lines:  # its lookup logs no line of the grammar's (GDN, grouped fmoe; mxscale's logger is
        # `from aiter import logger`, which the harness does not capture)
        return [f"log line read as {ev.family} {ev.shape}, but {family.name} logs none" for ev in events[:1]]
    out, seen = [], set()
    for ev in events:
        key = make_shape(family, ev.shape, "log").key if ev.family == family.name else None
        if key in maybe:
            continue
        if key not in printed or printed[key] != ev.hit:
            out.append(f"log line read as {ev.family} hit={ev.hit} {ev.shape}: AITER's lookup "
                       + ("made no such call" if key not in printed else f"found={printed[key]}"))
        seen.add(key)
    hits = {k for k, ev_hit in printed.items() if ev_hit}
    if not hits <= seen:
        out.append(f"log: {len(hits - seen)} lookup(s) that found a row have no line read")
    if family.m_column != "token" and seen != set(printed):  # a GEMM's miss is logged too (MoE: padded tokens)
        out.append(f"log: {len(seen)} distinct lookup line(s) read, {len(printed)} distinct lookups made")
    return out


def teardown_module(module):
    if RESULTS:
        print("\nfamily x form x identity x flydsl x release -> shapes -> outcome")
        for r in RESULTS:
            print("  " + " | ".join(str(x) for x in r))
        print(summary(RESULTS))


def summary(results: list[tuple]) -> str:
    """Per family (or case) x release x identity, over forms and FlyDSL on/off: the deploy forms offered, their
    shape verdicts (hit, raises, disagreements), and the forms refused (each where AITER raised too, or not)."""
    import collections
    acc: dict[tuple, collections.Counter] = {}
    for label, _form, where, _fly, rel, n, *out in results:
        c = acc.setdefault((label, rel, where), collections.Counter())
        if out[0].startswith("hits"):
            nums = {w.split()[0]: int(w.split()[1]) for w in out}
            c.update(offered=1, shapes=n, hit=nums["hits"], raises=nums.get("raises", 0), disagree=nums["disagree"],
                     unknown=nums.get("unknown", 0))
        else:
            c["refused, AITER raises" if out == ["refused", "raises"] else "mismatch"] += 1
    lines = ["| family / case | release | gfx/cu | forms offered | shape verdicts | hit | raises | unknown | disagree "
             "| forms refused (AITER raises too) | refusal mismatches |", "|" + "---|" * 11]
    lines += [f"| {k[0]} | {k[1]} | {k[2]} | {c['offered']} | {c['shapes']} | {c['hit']} | {c['raises']} "
              f"| {c['unknown']} | {c['disagree']} | {c['refused, AITER raises']} | {c['mismatch']} |"
              for k, c in acc.items()]
    return "\n".join(lines)


GDN_HEADER = ("gfx,cu_num,dtype,K,V,BT,H,Hg,is_varlen,use_h0,store_fs,snapshot_bf16,state_bf16,T_flat,N,"
              "total_chunks,max_seq_chunks,BV,us")
GDN_ROWS = ("gfx942,304,torch.bfloat16,128,128,64,32,16,False,True,False,True,False,2048,1,32,32,64,147.9",
            "gfx942,304,torch.bfloat16,128,128,64,8,4,False,True,False,True,False,2048,1,32,32,32,149.7",
            "gfx942,304,torch.bfloat16,128,128,64,16,4,False,True,False,True,False,2048,1,32,32,32,150.2")
# (name, the deployed file, merged ':' with the shipped default?)
GDN_COMMENTED = (
    ("leading-and-indented", f"# tuned on MI300X\n{GDN_HEADER}\n{GDN_ROWS[0]}\n  # {GDN_ROWS[1]}\n{GDN_ROWS[2]}\n",
     False),
    ("comment-with-commas", f"{GDN_HEADER}\n{GDN_ROWS[0]}\n# a, comment, with commas\n{GDN_ROWS[2]}\n", False),
    ("commented-out-row", f"{GDN_HEADER}\n{GDN_ROWS[0]}\n#{GDN_ROWS[1]}\n{GDN_ROWS[2]}\n", False),
    # the loader reads by column name: with cu_num first, a commented-out row would be an int() error if kept
    ("commented-out-row-cu-num-first", "cu_num,gfx" + GDN_HEADER.removeprefix("gfx,cu_num") + "\n"
     + "\n".join(f"{'#' if i == 1 else ''}304,gfx942" + r.removeprefix("gfx942,304")
                 for i, r in enumerate(GDN_ROWS)) + "\n", False),
    ("quoted-first-cell", f'{GDN_HEADER}\n{GDN_ROWS[0]}\n"# a, b",304\n{GDN_ROWS[2]}\n', False),
    # pandas' merge keeps a comment line as a row with blanks: its integer columns come out as 128.0
    ("merged-comment-with-commas", f"{GDN_HEADER}\n{GDN_ROWS[0]}\n# a, comment\n{GDN_ROWS[2]}\n", True),
    ("merged-commented-out-row", f"{GDN_HEADER}\n{GDN_ROWS[0]}\n#{GDN_ROWS[1]}\n{GDN_ROWS[2]}\n", True),
    ("merged-row-without-bv", f"{GDN_HEADER}\n{GDN_ROWS[0]}\n{GDN_ROWS[1].replace(',32,149.7', ',,149.7')}\n", True),
    ("merged-leading-comment", f"# tuned on MI300X\n{GDN_HEADER}\n{GDN_ROWS[0]}\n{GDN_ROWS[2]}\n", True),
)


@pytest.mark.parametrize("name,text,merged", GDN_COMMENTED, ids=[c[0] for c in GDN_COMMENTED])
def test_gdn_comment_lines_are_read_as_aiter_reads_them(name, text, merged, tmp_path):
    """The GDN K5 loader skips '#' lines (csv over the lines not starting with '#', int() of its cells, {} on a
    ValueError: linear_attention_prefill_kernels.py:658-705); AITER's ':' merge reads with pandas, which keeps
    them as rows (and a first-line comment as the header). The service (TableFamily.comment_prefix, loader_ints)
    must agree with AITER's own code, one deployed file and merged with the shipped default."""
    current = RELEASES[0]
    family = get_family("gdn_k5_opt")
    src = tree_with(family.aiter_lookup.split(":")[0])
    gfx, cu = "gfx942", 304
    keys = [c for c in family.shape_columns]
    shapes = [{k: dict(zip(GDN_HEADER.split(","), r.split(",")))[k] for k in keys} for r in GDN_ROWS]
    shapes.append(dict(shapes[0], H="64"))  # a shape no row has
    root = sandbox(tmp_path, CONFIGS, family, CURRENT)
    cfg = root / "aiter" / "configs"
    deployed = root / "overlays" / "commented.csv"
    deployed.parent.mkdir()
    deployed.write_text(text)
    files = [deployed] + ([cfg / family.tuned_file] if merged else [])
    tables = [read_table(p.read_text(), p.name, family.comment_prefix) for p in files]
    untuned = parse_header_line((cfg / family.untuned_file).read_text().splitlines()[0])
    table, error, _ = deploy.resolve(CURRENT, family, tables, [p.name for p in files], untuned, gfx)
    out = ax.run(src, src / "csrc", "current", root, family, ":".join(map(str, files)),
                 ax.Identity(gfx, cu, True), shapes)
    aiter_error = out.error or out.lookup_error
    assert bool(error) == bool(aiter_error), (error, aiter_error)
    if error:
        return
    mine = eng.check(family, family.key_columns, gfx, cu, shapes, table)
    theirs = out.verdicts
    assert [m.hit for m in mine] == [h for h, _ in theirs], [m.reason for m in mine]
    assert [(m.row or {}).get("BV") for m in mine if m.hit] == [str(c["BV"]) for h, c in theirs if h]
    RESULTS.append(("gdn_k5_opt", f"comments:{name}", f"{gfx}/{cu}", True, "current", len(shapes),
                    f"hits {sum(m.hit for m in mine)}", "disagree 0"))


def current_tree(name: str, tmp_path: Path) -> tuple:
    """(family, AITER's current sources with its lookup, a sandboxed aiter tree of its configs), else skip."""
    family = get_family(name)
    return family, tree_with(family.aiter_lookup.split(":")[0]), sandbox(tmp_path, CONFIGS, family, CURRENT)


@pytest.mark.parametrize("us_of_ours", ["same", "lower"])
def test_the_files_aiter_rewrites_on_a_repeated_key_are_the_ones_the_service_names(us_of_ours, tmp_path):
    """update_config_files keeps, per repeated key, the first row of a stable sort by us (core.py:340-346) and
    rewrites each file that lost a row before raising (:348-366): on a tie the earlier path's row stays (ours,
    listed last, is rewritten); a lower us of ours takes the shipped file's row."""
    family, src, root = current_tree("bf16_gemm", tmp_path)
    shipped = shipped_of(root, family, CURRENT)
    row = shipped.default.rows[0]
    gfx, cu = row["gfx"], int(row["cu_num"])
    us = row["us"] if us_of_ours == "same" else str(float(row["us"]) / 2)
    overlay = Table(shipped.default.header, [dict(row, us=us, kernelName="ours")], "svc_0123456789ab_" +
                    family.tuned_file)
    art = deploy.build(CURRENT, family, "layer", shipped, overlay, gfx)
    (root / "overlays").mkdir()
    (root / "overlays" / overlay.name).write_text(render_csv(overlay.header, overlay.rows))
    cfg = root / "aiter" / "configs"
    env = ":".join(str(root / "overlays" / n) if n == overlay.name else str(cfg / n) for n in art.files)
    out = ax.run(src, src / "csrc", "current", root, family, env, ax.Identity(gfx, cu, True),
                 [{c: row[c] for c in family.shape_columns}])
    assert out.error and art.refused, (out.error, art.refused)
    mine = sorted(Path(n).name for n in art.rewritten)
    assert sorted(Path(p).name for p in out.rewritten) == mine
    assert mine == ([overlay.name] if us_of_ours == "same" else [family.tuned_file])


@pytest.mark.parametrize("second", ["identical", "other_us"])
def test_a_row_repeated_in_the_one_deployed_file_is_dropped_or_raises_as_aiter_does(second, tmp_path):
    """tuned_gemm.py:87-101: drop_duplicates() drops a row identical in every cell to an earlier one, then
    set_index(...).to_dict('index') raises on a key still repeated (engagement.lookup_index)."""
    family, src, root = current_tree("bf16_gemm", tmp_path)
    default = read_table((root / "aiter" / "configs" / family.tuned_file).read_text(), family.tuned_file)
    row = default.rows[0]
    again = dict(row) if second == "identical" else dict(row, us=str(float(row["us"]) * 2))
    table = Table(default.header, [row, *default.rows[1:4], again], "one.csv")
    deployed = root / "overlays" / table.name
    deployed.parent.mkdir()
    deployed.write_text(render_csv(table.header, table.rows))
    gfx, cu = row["gfx"], int(row["cu_num"])
    shapes = [{c: r[c] for c in family.shape_columns} for r in table.rows]
    out = ax.run(src, src / "csrc", "current", root, family, str(deployed), ax.Identity(gfx, cu, True), shapes)
    lk = eng.prepare(family, family.key_columns, gfx, table, ((gfx, cu),))
    assert bool(lk.raises) == bool(out.error or out.lookup_error), (lk.raises, out.error, out.lookup_error)
    assert bool(lk.raises) == (second == "other_us")
    if lk.raises is None:
        mine = eng.check(family, family.key_columns, gfx, cu, shapes, table, prepared=lk)
        assert [m.hit for m in mine] == [h for h, _ in out.verdicts] == [True] * len(shapes)


# ------------------------------------------------------------------ the cases issue 25 found, at the op

def crafted_rows(family, header, shapes, pool, cells, gfx_cu) -> list[dict[str, str]]:
    rng = random.Random(7)
    out = []
    for s, extra in zip(shapes, cells):
        if extra is not None:
            v = {**result_cells(family, pool, rng), **s, **extra, "gfx": gfx_cu[0], "cu_num": str(gfx_cu[1])}
            out.append({c: v.get(c, "") for c in header})
    return out


def a8w8_foreign_fp8(ident):
    """Shipped float8_e4m3fn shapes (gfx942's foreign fp8) and fnuz ones (gfx950's), with int8 and the GPU's own
    fp8: rows keyed on the captured dtype (what a tuner writes) and on int8 (what gemm_a8w8_CK looks up)."""
    def case(family, header, shapes, pool):
        base = [s for s in shipped_shapes(CONFIGS, family) if s["q_dtype_w"] == "torch.float8_e4m3fn"][:12]
        out = [dict(s, q_dtype_w=w) for s in base for w in ("torch.float8_e4m3fn", "torch.float8_e4m3fnuz",
                                                           "torch.int8")]
        keyed = [None if i % 4 == 3 else {} if i % 4 < 2 else {"q_dtype_w": "torch.int8"} for i in range(len(out))]
        return out, Table(header, crafted_rows(family, header, out, pool, keyed, ident), "svc_0123456789ab_" +
                          family.tuned_file)
    return case


def bf16_bpreshuffle(ident):
    """bpreshuffle calls with and without a row, where the asm default fits and where it does not (N, K not
    multiples of 64, fp16 in or out)."""
    def case(family, header, shapes, pool):
        base = {"bias": "False", "scaleAB": "False", "bpreshuffle": "True"}
        out = [dict(base, M=str(m), N=str(n), K=str(k), dtype=d, outdtype=o)
               for m in (1, 40) for n, k in ((1280, 8192), (1288, 8192), (1280, 8200))
               for d, o in (("torch.bfloat16", "torch.bfloat16"), ("torch.bfloat16", "torch.float32"),
                            ("torch.float16", "torch.float16"), ("torch.bfloat16", "torch.float16"))]
        cells = [{"libtype": "asm", "kernelName": "_ZN5aiter_svcE"} if i % 5 == 0 else None for i in range(len(out))]
        return out, Table(header, crafted_rows(family, header, out, pool, cells, ident), "svc_0123456789ab_" +
                          family.tuned_file)
    return case


def fmoe_one_stage_cells(ident):
    """1-stage rows with an empty xbf16 or flat cell (AITER int()s them: fused_moe.py:2445, :2449), beside valid
    1-stage and 2-stage rows; rows the service refuses at post are here as a table written by hand would be."""
    def case(family, header, shapes, pool):
        header = tuple(header) + tuple(c for c in ("xbf16", "flat") if c not in header)
        out = shapes[:40]
        kinds = ({"run_1stage": "1", "xbf16": "", "flat": "0"}, {"run_1stage": "1", "xbf16": "0", "flat": ""},
                 {"run_1stage": "1", "xbf16": "0", "flat": "0"},
                 {"run_1stage": "0", "xbf16": "", "flat": ""}, None)
        # kernel names of the kinds the op's stage launchers run (asm 1-stage, CK 2-stage): a name no launcher
        # runs raises at launch, which is not what this case is about
        names = ({"kernelName1": "_ZN5aiter_svc1E", "kernelName2": ""}, {"kernelName1": "moe_ck2stages_gemm1_svc",
                                                      "kernelName2": "moe_ck2stages_gemm2_svc"})
        cells = [dict(kinds[i % 5], block_m="32", ksplit="0", **names[i % 5 == 3]) if kinds[i % 5] else None
                 for i in range(len(out))]
        return out, Table(header, crafted_rows(family, header, out, pool, cells, ident), "svc_0123456789ab_" +
                          family.tuned_file)
    return case


def fhmoe_tiers(ident, kernels: dict[int, str], tokens: tuple[int, ...]):
    """DSV4 I384 calls above the shipped tiers (1..2048): the shared-expert entry needs a row it runs at every
    padded tier up to M (fhmoe.py:345-385, :579-583) and both stages FlyDSL (:304-317). kernels: the rows made, by
    token tier: "fly" (a shipped FlyDSL pair) or "ck" (its stage 1 a CK kernel)."""
    def case(family, header, shapes, pool):
        base = next(s for s in shipped_shapes(CONFIGS, family))
        fly = next(c for c in pool if str(c.get("kernelName1", "")).startswith("flydsl_"))
        kinds = {"fly": fly, "ck": dict(fly, kernelName1="moe_ck2stages_gemm1_svc")}
        table = [{c: {**kinds[k], **base, "token": str(t), "gfx": ident[0], "cu_num": str(ident[1])}.get(c, "")
                  for c in header} for t, k in kernels.items()]
        return [dict(base, token=str(t)) for t in tokens], Table(header, table, "svc_0123456789ab_" + family.tuned_file)
    return case


FHMOE_TIERS = {"gap_at_16384": ({4096: "fly", 8192: "fly", 32768: "fly"}, (3000, 5000, 8000, 20000, 40000, 64)),
               "ck_stage_at_131072": ({4096: "fly", 8192: "fly", 16384: "fly", 32768: "fly", 131072: "ck"},
                                      (20000, 40000, 200000, 64))}


CASES = {"a8w8_foreign_fp8": ("a8w8_gemm", a8w8_foreign_fp8), "bf16_bpreshuffle": ("bf16_gemm", bf16_bpreshuffle),
         "fmoe_one_stage_cells": ("fmoe", fmoe_one_stage_cells)}


@pytest.mark.parametrize("ident", IDENTITIES, ids=lambda x: f"{x[0]}-{x[1]}")
@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("rel", RELEASES, ids=[r[0] for r in RELEASES])
def test_issue_25_cases_agree_with_aiter_at_the_op(rel, name, ident, tmp_path):
    """The service's verdict (hit, miss, raises and the row) on the cases issue 25 found equals what AITER's own
    op does (a8w8: gemm_a8w8_CK with its kernel stubbed), on every deploy form."""
    family_name, case = CASES[name]
    compare(rel, family_name, ident, False, tmp_path, case=case(ident), label=name)


# ------------------------------------------------------------------ the GEMM ops' own dispatch after the row

def _distinct(n: int, **base: str) -> list[dict[str, str]]:
    """n shapes with base's cells, one N each (a row per shape, never two on one key)."""
    return [dict(base, N=str(1024 + 64 * i)) for i in range(n)]


def rows_case(shapes: list[dict[str, str]], cells: list[dict | None]):
    """The shapes, and a row at each one's own M with these cells (None: no row)."""
    def case(ident):
        def make(family, header, _shapes, pool):
            return shapes, Table(header, crafted_rows(family, header, shapes, pool, cells, ident),
                                 "svc_0123456789ab_" + family.tuned_file)
        return make
    return case


_ASM = "_ZN5aiter_svcE"
_BF16_LIBTYPES = ("torch", "skinny", "hipblaslt", "asm", "triton", "opus", "flydsl")
# every libtype's solfunc (tuned_gemm.py:357-602) with bpreshuffle and scaleAB on and off; a skinny row whose solidx
# skinny_gemm has no branch for; a flydsl row the FlyDSL catalog does not know; a triton row with a FlyDSL name
_BF16_CELLS = [{"libtype": lt, "solidx": "0", "splitK": "0", "kernelName": "flydsl_svc" if lt == "flydsl" else _ASM}
               for lt in _BF16_LIBTYPES for _ in range(4)]  # the first 28: each bpreshuffle x scaleAB
_BF16_CELLS += [{"libtype": "skinny", "solidx": "3", "kernelName": _ASM},
                {"libtype": "flydsl", "solidx": "0", "kernelName": "svc_kernel"},
                {"libtype": "triton", "solidx": "0", "kernelName": "flydsl_svc"}, None, None]
_BF16_SHAPES = [dict(s, bpreshuffle=("True", "False")[i % 2 if i < 28 else 1],
                     scaleAB=("True", "False")[i // 2 % 2 if i < 28 else 1])
                for i, s in enumerate(_distinct(len(_BF16_CELLS), M="64", K="8192", bias="False",
                                                dtype="torch.bfloat16", outdtype="torch.bfloat16"))]
# int8 weights (gemm_a8w8_ASM), the GPU's own fp8 and the other one (gemm_a8w8_bpreshuffle asserts), rows of every
# libtype it branches on; flydsl rows whose kernel name its parser reads and does not
_FLY_OK, _FLY_BAD = "flydsl_bpreshuflle_16x64x512_F8_F8_B16_0x3x0x1_default", "flydsl_bpreshuffle_16x64x512_x"
_BPRE_CELLS = [{"libtype": lt, "kernelName": k, "splitK": "0"} for lt, k in (
    ("ck", "a8w8_bpreshuffle_svc"), ("cktile", "a8w8_bpreshuffle_svc"), ("flydsl", _FLY_OK), ("flydsl", _FLY_BAD),
    ("asm", _ASM), ("triton", "svc"))] + [None]
_BPRE_SHAPES = [dict(s, q_dtype_w=w) for w in ("torch.int8", "torch.float8_e4m3fn", "torch.float8_e4m3fnuz")
                for s in _distinct(len(_BPRE_CELLS), M="32", K="7168")]
for i, s in enumerate(_BPRE_SHAPES):
    s["N"] = str(1024 + 64 * i)
_BLOCK_CELLS = [{"libtype": lt, "kernelName": "svc", "splitK": "0", "kernelId": "3"}
                for lt in ("ck", "cktile", "asm", "triton", "opus", "flydsl", "hipblaslt")] + [None]
_MX_CELLS = [{"libtype": "opus", "kernelId": "3", "splitK": "0"}, {"libtype": "opus", "kernelId": "", "splitK": "0"},
             {"libtype": "flydsl", "kernelId": "3", "splitK": "0"}, {"libtype": "ck", "kernelId": "3", "splitK": "0"},
             None]
def flydsl_names(seed: int, n: int = 40):
    """Fresh shapes (seeded random M, N, K, dtypes; none from the fixtures) with FlyDSL rows at the raw M and at a
    padded M, their kernel names as AITER's catalog builds them today, in the format before ROCm/aiter#3469 (no
    _block_k_warp), with another weight dtype than the activation's, another gfx suffix, or a bare prefix: AITER's
    real catalog (ops/flydsl/gemm_kernels.py) decides each (tuned_gemm.py:163-177)."""
    def case(ident):
        def make(family, header, _shapes, pool):
            rng = random.Random(f"flydsl-names-{seed}")
            shapes, rows = [], []
            for i in range(n):
                dt = rng.choice(("torch.bfloat16", "torch.float16"))
                s = dict(M=str(rng.randint(1, 9000)), N=str(64 * rng.randint(2, 300)), K=str(64 * rng.randint(2, 200)),
                         bias=rng.choice(("True", "False")), dtype=dt, outdtype=dt, scaleAB="False",
                         bpreshuffle="False")
                a = "bf16" if dt == "torch.bfloat16" else "f16"
                name = (f"flydsl_gemm{rng.randint(2, 8)}_a{a}_w{a}_{a}_t{rng.choice((16, 32, 64))}x"
                        f"{rng.choice((64, 128))}x{rng.choice((64, 128))}_split_k{rng.randint(1, 13)}_block_m_warp"
                        f"{rng.choice((1, 2))}_block_n_warp{rng.choice((1, 2, 4))}_block_k_warp{rng.choice((1, 2))}_"
                        f"async_copy{ident[0] != 'gfx942'}_b_to_ldsTrue_b_preshuffleFalse_c_to_ldsFalse_{ident[0]}")
                names = (name, re.sub(r"_block_k_warp\d+", "", name), name.replace(f"_w{a}_", "_wfp8_"),
                         name.replace(ident[0], "gfx1250"), "flydsl_gemm2_" + a)
                shapes.append(s)
                for m in sorted({s["M"], str(rng.choice(m_candidates(family, s)))}):  # sorted: the rng draws in one order
                    libtype = "flydsl" if rng.random() < 0.85 else rng.choice(("asm", "hipblaslt"))
                    v = {**result_cells(family, pool, rng), **s, "M": m, "gfx": ident[0], "cu_num": str(ident[1]),
                         "libtype": libtype, "solidx": "0", "splitK": "0", "kernelName": rng.choice(names)}
                    rows.append({c: v.get(c, "") for c in header})
            return shapes, Table(header, rows, "svc_0123456789ab_" + family.tuned_file)
        return make
    return case


OP_CASES = {
    "bf16_solfuncs": ("bf16_gemm", rows_case(_BF16_SHAPES, _BF16_CELLS)),
    "bf16_flydsl_names": ("bf16_gemm", flydsl_names(35)),
    "a8w8_bpreshuffle_ops": ("a8w8_bpreshuffle_gemm", rows_case(_BPRE_SHAPES, _BPRE_CELLS * 3)),
    "blockscale_bpreshuffle_libtypes": ("a8w8_blockscale_bpreshuffle_gemm",
                                        rows_case(_distinct(len(_BLOCK_CELLS), M="64", K="7168"), _BLOCK_CELLS)),
    "mxscale_libtypes": ("a8w8_blockscale_mxscale_batched_gemm", rows_case(
        [{"b": "16", "m": "64", "n": str(512 + 128 * i), "k": "7168"} for i in range(len(_MX_CELLS))], _MX_CELLS)),
}


# ------------------------------------------------------------------ the MoE op's own argument path (fused_moe)

def fmoe_activation_dtypes(ident, situv2: bool = True, tokens: tuple[str, ...] = ("100", "255", "256", "1000"),
                           quant: str | None = None):
    """Captured per_1x32 and per_Token shapes whose q_dtype_a is, or is not, the one _fused_moe_impl derives from
    the weight dtype, activation and raw token count (fused_moe.py:761-806): rows keyed on the captured value
    (what a tuner writes for the capture) and on every other activation dtype, with kernels of their own kind.
    The op looks up only the derived one."""
    fp8 = "torch.float8_e4m3fnuz" if ident[0] == "gfx942" else "torch.float8_e4m3fn"
    p1x32 = "QuantType.per_1x32"
    bases = [("ActivationType.Swiglu", _FP4, p1x32), ("ActivationType.Silu", _FP4, p1x32),
             ("ActivationType.Situv2", _FP4, p1x32), ("ActivationType.Silu", fp8, p1x32),
             ("ActivationType.Silu", "torch.int4", p1x32), ("ActivationType.Silu", fp8, "QuantType.per_Token")]

    def case(family, header, shapes, pool):
        out, keyed = [], []
        for act, w, q in bases:
            if (act == "ActivationType.Situv2" and not situv2) or quant not in (None, q):
                continue
            for token in tokens:
                for a in ("torch.bfloat16", _FP4, fp8):
                    s = dict(token=token, model_dim="4096", inter_dim="512", expert="128", topk="8", act_type=act,
                             dtype="torch.bfloat16", q_dtype_a=a, q_dtype_w=w, q_type=q, use_g1u1="1",
                             doweight_stage1="0")
                    kind = [c for c in pool if c.get("_kind") == moe_kind(s) and c.get("run_1stage") != "1"]
                    out.append(s)
                    keyed.append(dict(random.Random(token + a).choice(kind)) if kind else None)
        rows = []
        for s, cells in zip(out, keyed):
            if cells is not None:
                v = {**cells, **s, "gfx": ident[0], "cu_num": str(ident[1]), "us": "10.0"}
                rows.append({c: v.get(c, "") for c in header})
        return out, Table(header, rows, "svc_0123456789ab_" + family.tuned_file)
    return case


_FP4 = "torch.float4_e2m1fn_x2"


@pytest.mark.parametrize("flydsl", [True, False], ids=["flydsl", "no-flydsl"])
@pytest.mark.parametrize("ident", IDENTITIES, ids=lambda x: f"{x[0]}-{x[1]}")
@pytest.mark.parametrize("name", OP_CASES)
@pytest.mark.parametrize("rel", RELEASES, ids=[r[0] for r in RELEASES])
def test_gemm_ops_run_the_row_as_aiter_does(rel, name, ident, flydsl, tmp_path):
    """What runs after the row (the op's libtype branches, its solfuncs' asserts, its dtype asserts, its default
    kernel) is AITER's own op, called with meta tensors of the shape and its launchers stubbed; the service's
    verdict (family.op_paths, libtype_use, read_cells, flydsl_catalog) must be the same, shape by shape."""
    family_name, case = OP_CASES[name]
    compare(rel, family_name, ident, flydsl, tmp_path, case=case(ident), label=name)


def test_every_gemm_family_is_probed_through_its_op():
    """The harness calls each GEMM family's op, never its lookup alone: the op's function is its own code here
    (op_function), so make_probe takes the op path (a real AITER's torch custom ops fall back to the lookup)."""
    from workers import engagement_probe as probe
    gemm = [f for n, f in ALL_FAMILIES.items() if f.aiter_lookup and f.m_column in ("M", "m")]
    assert {f.name for f in gemm} == {n for n, f in ALL_FAMILIES.items() if f.op_entries}
    for family in gemm:
        src = tree_with(family.aiter_lookup.split(":")[0])
        p = ax.AiterProcess(src, src, ax.Identity("gfx950", 256, True), "current", src / "csrc")
        p.core()
        mod = p.module(family.aiter_lookup.split(":")[0])
        assert all(probe.op_function(mod, e) is not None for e in family.op_entries), family.name


def test_an_op_that_is_a_torch_custom_op_is_probed_through_its_own_body(tmp_path):
    """In a real AITER torch_compile_guard makes the op a torch custom op (called with meta tensors it runs its
    fake): the in-image probe then compiles the op's body anew without its decorators (undecorated), in the
    module's own globals, so the same op runs as in the harness and the verdicts are the same."""
    from workers import engagement_probe as probe
    family = get_family("a8w8_blockscale_gemm")
    rel = family.aiter_lookup.split(":")[0]
    src = tree_with(rel)
    root = sandbox(tmp_path, CONFIGS, family, RELEASES[0])  # AITER's shipped tables beside its code

    def verdicts(guarded: bool) -> list:
        p = ax.AiterProcess(src, root, ax.Identity("gfx950", 256, True), "current", src / "csrc")
        if guarded:
            def guard(*a, **k):
                def deco(f):
                    def wrapper_custom(*a, **k):
                        raise AssertionError("a custom op called with meta tensors runs its fake, never the op")
                    return wrapper_custom
                return deco
            p.registry["aiter.jit.utils.torch_guard"].__dict__["torch_compile_guard"] = guard
        core = p.core()
        mod = p.module(rel)
        entry = family.op_entries[0]
        assert (probe.op_function(mod, entry) is None) == guarded  # the module holds the custom op, not the op
        look = probe.make_probe(family, p.module, p, True, "gfx950", 256, None,
                                probe.resolved_file(core, family.aiter_file_attr), p.import_module)
        assert look.__qualname__.startswith("op_probe.")
        shapes = [{"M": str(m), "N": "7168", "K": "2048"} for m in (1, 16, 128, 5000)]
        return [probe.outcome(look, s_) for s_ in shapes]
    with ax._merge_lock():
        guarded, plain = verdicts(True), verdicts(False)
    assert guarded == plain and all(r is None for _, _, r in guarded), guarded
    assert any(hit for hit, _, _ in guarded)  # a shipped row engages: the op ran past its lookup



@pytest.mark.parametrize("flydsl", [True, False], ids=["flydsl", "no-flydsl"])
@pytest.mark.parametrize("ident", IDENTITIES, ids=lambda x: f"{x[0]}-{x[1]}")
@pytest.mark.parametrize("rel", RELEASES, ids=[r[0] for r in RELEASES])
def test_fmoe_is_looked_up_with_the_activation_dtype_the_op_derives(rel, ident, flydsl, tmp_path):
    """fused_moe derives q_dtype_a itself (bf16 for a16w4/int4, fp4x2 above the Swiglu bound, the weight's dtype
    otherwise; 0.1.7: fp4x2 for any per_1x32): a row keyed on another captured q_dtype_a never engages, and the
    service must say so (TableFamily.moe_op)."""
    # 0.1.7's ActivationType has no Situv2 (its aiter_enum.h): no server of it calls with one
    compare(rel, "fmoe", ident, flydsl, tmp_path, case=fmoe_activation_dtypes(ident, rel[0] == "current"),
            label="fmoe_q_dtype_a")


@pytest.mark.parametrize("flydsl", [True, False], ids=["flydsl", "no-flydsl"])
@pytest.mark.parametrize("ident", IDENTITIES, ids=lambda x: f"{x[0]}-{x[1]}")
@pytest.mark.parametrize("name", FHMOE_TIERS)
def test_fhmoe_needs_every_tier_and_flydsl_stages_as_its_entry_does(name, ident, flydsl, tmp_path):
    """fused_moe with shared experts (-> aiter/fhmoe.py fhmoe_) on gfx950 only, a row it runs at every padded tier
    up to M, two FlyDSL stages (TableFamily.moe_op: FHMOE_OP); 0.1.7 has no fhmoe."""
    compare(RELEASES[0], "fhmoe", ident, flydsl, tmp_path, case=fhmoe_tiers(ident, *FHMOE_TIERS[name]),
            label=f"fhmoe_{name}")


# the serving environment's MoE knobs (fused_moe.py:76, :768, :781-784, :799-803), as a capture's env carries them:
# other bounds, the SiTUv2 activation switches, AITER_FORCE_A8W4 set (empty too: `in ("1")` is a substring test) on a
# GPU_ARCHS whose last entry is gfx1250, and bounds int() rejects
MOE_ENVS = ({"AITER_BF16_FP8_MOE_BOUND": "1000"}, {"AITER_BF16_FP8_MOE_BOUND": "64"},
            {"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "2048"}, {"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "1"},
            {"AITER_SITUV2_A8W4": "1"}, {"AITER_SITUV2_A4W4": "1"}, {"AITER_SITUV2_A8W4": "true"},
            {"GPU_ARCHS": "gfx942;gfx1250", "AITER_FORCE_A8W4": ""}, {"GPU_ARCHS": "gfx942;gfx1250", "AITER_FORCE_A8W4": "1"},
            {"GPU_ARCHS": "gfx942;gfx1250", "AITER_FORCE_A8W4": "0"}, {"AITER_BF16_FP8_MOE_BOUND": "x"}, {})


@pytest.mark.parametrize("env", MOE_ENVS, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
@pytest.mark.parametrize("ident", IDENTITIES, ids=lambda x: f"{x[0]}-{x[1]}")
def test_fmoe_derives_the_activation_dtype_from_the_servers_environment(ident, env, tmp_path):
    """_fused_moe_impl reads its bounds and switches from the environment (fused_moe.py:76, :768, :776-803): the
    service derives q_dtype_a from the capture's env, on fresh seeded tokens around each bound."""
    rng = random.Random(f"moe-env-{sorted(env.items())}")
    tokens = tuple(str(t) for t in sorted({rng.randint(1, 3000) for _ in range(4)} | {63, 64, 999, 1000, 2047}))
    # per_1x32 calls: the branches that read the environment (per_Token's q_dtype_a is the weight's whatever it says)
    compare(RELEASES[0], "fmoe", ident, True, tmp_path, env=env,
            case=fmoe_activation_dtypes(ident, tokens=tokens, quant="QuantType.per_1x32"), label="fmoe_env")


def fmoe_shared_calls(seed: int, n: int = 24):
    """Fresh shared-expert calls outside the DSV4 I384 contract (seeded random sizes, tokens below the fp8 bound: a
    captured fp8 activation only fhmoe_'s INTERLEAVE call derives), with rows of two FlyDSL stages, two CK stages, an
    asm 1-stage kernel, or none: fhmoe_ puts their stages through _use_fhmoe_wrappers (fhmoe.py:304-317, :563-613),
    which raises on any but the two FlyDSL stages."""
    def case(ident):
        fp8 = "torch.float8_e4m3fnuz" if ident[0] == "gfx942" else "torch.float8_e4m3fn"
        kinds = ({"kernelName1": "flydsl_moe1_svc", "kernelName2": "flydsl_moe2_svc", "run_1stage": "0"},
                 {"kernelName1": "moe_ck2stages_gemm1_svc", "kernelName2": "moe_ck2stages_gemm2_svc", "run_1stage": "0"},
                 {"kernelName1": "_ZN5aiter_svcE", "kernelName2": "", "run_1stage": "1", "xbf16": "0", "flat": "0"},
                 None)

        def make(family, header, _shapes, pool):
            rng = random.Random(f"fmoe-shared-{seed}")
            shapes, rows = [], []
            for i in range(n):
                s = dict(token=str(rng.randint(1, 255)), model_dim=str(256 * rng.randint(4, 28)),
                         inter_dim=str(128 * rng.randint(1, 24)), expert=str(rng.choice((64, 128, 256, 257))),
                         topk=str(rng.randint(2, 9)), act_type="ActivationType.Silu", dtype="torch.bfloat16",
                         q_dtype_a=fp8 if i % 5 else _FP4, q_dtype_w=_FP4, q_type="QuantType.per_1x32", use_g1u1="1",
                         doweight_stage1="0")  # every fifth an fp4 activation: a plain fused_moe call
                shapes.append(s)
                kind = kinds[i % len(kinds)]
                if kind is not None:
                    v = {**s, **kind, "token": str(rng.choice(m_candidates(family, s))), "gfx": ident[0],
                         "cu_num": str(ident[1]), "block_m": "32", "ksplit": "0", "us": f"{rng.uniform(1, 50):.3f}"}
                    rows.append({c: v.get(c, "") for c in header})
            return shapes, Table(header, rows, "svc_0123456789ab_" + family.tuned_file)
        return make
    return case


@pytest.mark.parametrize("flydsl", [True, False], ids=["flydsl", "no-flydsl"])
@pytest.mark.parametrize("ident", IDENTITIES, ids=lambda x: f"{x[0]}-{x[1]}")
def test_shared_expert_calls_outside_the_dsv4_contract_go_through_fhmoes_wrapper_step(ident, flydsl, tmp_path):
    """fused_moe with shared experts outside the DSV4 I384 contract reads tuned_fmoe, then fhmoe_'s wrapper step
    (fhmoe.py:304-317) raises unless both stages are FlyDSL's: the probe calls fused_moe with shared weights (AITER's
    own fhmoe_), and the service must say raises, hit or miss as it does."""
    compare(RELEASES[0], "fmoe", ident, flydsl, tmp_path, case=fmoe_shared_calls(35)(ident), label="fmoe_shared")


def bpreshuffle_padded_weights(seed: int, n: int = 48):
    """Fresh gemm_a8w8_bpreshuffle calls (seeded random M, N, K; fp8 and int8 weights) whose weight's K is the
    activation's, padded past it (a row at the weight's K of each libtype, or none; sometimes a row at K too), or
    smaller: ops/gemm_op_a8w8.py:711-742 retries a miss at the weight's K, runs that row, raises on a smaller one."""
    def case(ident):
        fp8 = "torch.float8_e4m3fnuz" if ident[0] == "gfx942" else "torch.float8_e4m3fn"

        def make(family, header, _shapes, pool):
            rng = random.Random(f"bpreshuffle-weights-{seed}")
            shapes, rows = [], []
            for i in range(n):
                k = 128 * rng.randint(2, 60)
                wk = rng.choice((k, k + 128 * rng.randint(1, 8), k + 32, k - 64))
                s = dict(M=str(rng.randint(1, 4000)), N=str(128 * rng.randint(2, 100)), K=str(k),
                         q_dtype_w=fp8 if i % 6 else "torch.int8", weight_K=str(wk))
                shapes.append(s)
                for at, chance in ((wk, 0.8), (k, 0.25)):
                    if rng.random() < chance:
                        lt, name = rng.choice((("ck", "a8w8_bpreshuffle_svc"), ("cktile", "a8w8_bpreshuffle_svc"),
                                               ("flydsl", _FLY_OK), ("asm", _ASM)))
                        v = {**result_cells(family, pool, rng), **s, "K": str(at), "libtype": lt, "kernelName": name,
                             "splitK": "0", "M": str(rng.choice(m_candidates(family, s))), "gfx": ident[0],
                             "cu_num": str(ident[1])}
                        rows.append({c: v.get(c, "") for c in header})
            seen, kept = set(), []
            for r in rows:  # one row per key (a repeated key raises in AITER's loader: another test's subject)
                key = tuple(r.get(c, "") for c in family.key_columns)
                if key not in seen:
                    seen.add(key)
                    kept.append(r)
            return shapes, Table(header, kept, "svc_0123456789ab_" + family.tuned_file)
        return make
    return case


@pytest.mark.parametrize("flydsl", [True, False], ids=["flydsl", "no-flydsl"])
@pytest.mark.parametrize("ident", IDENTITIES, ids=lambda x: f"{x[0]}-{x[1]}")
def test_bpreshuffle_retries_a_miss_at_the_padded_weights_k(ident, flydsl, tmp_path):
    compare(RELEASES[0], "a8w8_bpreshuffle_gemm", ident, flydsl, tmp_path, case=bpreshuffle_padded_weights(35)(ident),
            label="bpreshuffle_weight_k")


def gdn_bv_cells(ident):
    """Rows whose BV the K5 opt op does not run (linear_attention_prefill_kernels.py:1270: BV in 16, 32, 64), beside
    rows it runs: AITER raises on the first, and the service must predict it (TableFamily.read_cells)."""
    def case(family, header, shapes, pool):
        bvs = ("8", "128", "16", "64", None)
        cells = [None if bvs[i % 5] is None else {"BV": bvs[i % 5]} for i in range(len(shapes))]
        return shapes, Table(header, crafted_rows(family, header, shapes, pool, cells, ident),
                             "svc_0123456789ab_" + family.tuned_file)
    return case


@pytest.mark.parametrize("ident", IDENTITIES, ids=lambda x: f"{x[0]}-{x[1]}")
def test_gdn_rows_with_a_bv_the_op_does_not_run_are_predicted_to_raise(ident, tmp_path):
    compare(RELEASES[0], "gdn_k5_opt", ident, True, tmp_path, case=gdn_bv_cells(ident), label="gdn_bv_cells")
