"""How to deploy an overlay so AITER really loads it, and the table AITER builds from each way of deploying
(aiter-tuning.md section 9, aiter/jit/core.py:266-431 of each release).

Setting AITER_CONFIG_X replaces the shipped table (the default and model_configs/ are no longer read), so a
layered value must list them, joined by ':'. A key that appears twice in a merge makes the current release
rewrite the shipped CSVs in place and raise; 0.1.7 silently keeps the lowest us per key without cu_num.
Each form is judged on the table AITER would build from it; a form that raises or rewrites is not offered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.domain import engagement as eng
from app.domain.families import AiterRelease, TableFamily
from app.domain.keys import row_key
from app.domain.row_memo import NO_MEMO, RowMemo
from app.domain.tables import Table, aiter_merge, filled_rows, merge, union_header

FORMS = ("layer", "merged", "model_configs_dropin")


@dataclass
class Shipped:
    """The image's tables for a family, as its worker read them (paths relative to aiter/configs/)."""
    default: Table | None  # the release's env-unset default, when the image has it
    model_configs: list[Table]  # in the order the image listed them (AITER globs in filesystem order)
    untuned_header: tuple[str, ...] | None  # aiter/configs/<untuned>.csv's header (the merge's dedup key)
    known: bool  # the worker reported the image's tables
    # what each deploy form makes of these tables, kept while they are (row_memo): the next result's forms
    # cost about the overlay's share
    memo: RowMemo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.memo = RowMemo(self.tables)

    @property
    def tables(self) -> list[Table]:
        """The default (when the image has it), then the model_configs tables."""
        return [t for t in [self.default, *self.model_configs] if t is not None]


@dataclass
class Artifact:
    form: str
    files: list[str]  # what AITER reads, in order (names relative to configs/, the overlay by its own name)
    table: Table | None  # the table AITER's lookup reads
    refused: str | None = None  # why this form is not offered (AITER would raise or rewrite files)
    rewritten: list[str] = field(default_factory=list)
    overlay: Table | None = None  # the overlay file this form deploys
    excluded_shipped: int = 0  # overlay rows left out because the image ships their key (the full one raised)
    full_refused: str | None = None  # why the full overlay is not deployable this way


def resolve(release: AiterRelease, family: TableFamily, files: list[Table | None], names: list[str],
            untuned_header: tuple[str, ...] | None, live_gfx: str, concat: bool = False, memo: RowMemo = NO_MEMO
            ) -> tuple[Table | None, str | None, list[str]]:
    """update_config_files over a path list: one path is read as is; more are merged (missing ones skipped,
    except a missing first path in 0.1.7). concat: the loader reads the paths itself, every row of every
    existing file in order, nothing merged (family.env_concat)."""
    if concat:
        present = [t for t in files if t is not None]
        return Table(union_header(present), [r for t in present for r in t.rows], names[-1]), None, []
    if len(files) <= 1:
        return (files[0] if files and files[0] is not None else Table(()), None, [])
    if release.merge_first_must_exist and files[0] is None:
        return None, f"FileNotFoundError: {names[0]} does not exist in this image", []
    present = [t for t in files if t is not None]
    if not present:
        return None, "FileNotFoundError: no existing config files", []
    res = aiter_merge(release, family, untuned_header, present, live_gfx, memo)
    return res.table, res.error, res.rewritten


def merged_file(release: AiterRelease, family: TableFamily, shipped: Shipped, overlay: Table, live_gfx: str
                ) -> Table:
    """The one-file form: the shipped tables and the overlay, unique merge keys, lowest us winning; for
    first-match families the overlay's rows go first so its row is the one found."""
    tables = shipped.tables
    if not tables:
        return overlay
    order = [overlay, *tables] if family.overlay_first else [*tables, overlay]
    t = merge(release, family, shipped.untuned_header or family.untuned_header, order, live_gfx, shipped.memo)
    t.name = f"merged_{overlay.name}"
    return t


def build(release: AiterRelease, family: TableFamily, form: str, shipped: Shipped, overlay: Table,
          live_gfx: str) -> Artifact:
    default_name = release.default_file(family)
    mc_names = [t.name for t in shipped.model_configs]
    if form == "merged":
        t = merged_file(release, family, shipped, overlay, live_gfx)
        bad = [(i, c) for i, cs in enumerate(shipped.memo.per_row(("unfilled", family.filled, family.filled_unless),
                                                                   t.rows, family.unfilled)) for c in cs]
        if bad:
            i, c = bad[0]
            return Artifact(form, [t.name], t, f"row {i + 2} has an empty {c}; AITER would read it as NaN",
                            overlay=t)
        return Artifact(form, [t.name], t, overlay=t)
    if form == "layer":
        files: list[Table | None] = [*([shipped.default] if shipped.default is not None else []),
                                     *shipped.model_configs, overlay]
        names = ([default_name] if shipped.default is not None else []) + mc_names + [overlay.name]
    else:  # model_configs drop-in, env var unset: the default, every model_configs file, then ours
        if not shipped.known:
            return Artifact(form, [], None, "the image's tables are unknown (its worker has not reported them): "
                                            "a drop-in merges with files nobody has checked")
        files = [shipped.default, *shipped.model_configs, overlay]
        names = [default_name, *mc_names, f"model_configs/{overlay.name}"]
    table, err, rewritten = resolve(release, family, files, names, shipped.untuned_header, live_gfx,
                                    concat=family.env_concat and form == "layer", memo=shipped.memo)
    if err is not None:
        return Artifact(form, names, None, f"AITER {release.name} raises at start: {err}", rewritten, overlay)
    return Artifact(form, names, table, overlay=overlay)


def artifacts(release: AiterRelease, family: TableFamily, shipped: Shipped, overlay: Table, live_gfx: str,
              key_columns: tuple[str, ...]) -> dict[str, Artifact]:
    """Every form, each refused where AITER's merge or its loader would raise on what it builds. Where the full
    overlay makes a merge raise because it repeats shipped keys, the layer and the drop-in deploy the overlay
    without those rows (the shipped row stays; the merged file is the form in which ours win)."""
    out = {}
    for form in FORMS:
        a = build(release, family, form, shipped, overlay, live_gfx)
        # a drop-in lands somewhere in AITER's glob order, so for first-match lookups a row whose run-time key
        # a shipped row shares would win or lose by file system order: leave those out as well
        by_lookup = family.duplicate_keys == "first" and form == "model_configs_dropin"
        if form != "merged" and (a.rewritten or by_lookup):
            keys = eng.lookup_columns(family, key_columns) if by_lookup else None
            slim = Table(overlay.header, without_shipped_keys(release, family, shipped, overlay, live_gfx, keys),
                         overlay.name)
            if len(slim.rows) < len(overlay.rows) or a.refused:
                full = a.refused
                a = build(release, family, form, shipped, slim, live_gfx)
                a.excluded_shipped = len(overlay.rows) - len(slim.rows)
                a.full_refused = full or "rows whose run-time key a shipped row shares would win by glob order"
        if a.table is not None and a.refused is None:
            try:
                eng.lookup_index(family, eng.lookup_columns(family, key_columns),
                                 eng.loaded_rows(family, a.table, live_gfx), shipped.memo)
            except eng.LookupRaises as e:
                a.refused = f"AITER's loader raises on the table it builds: {e}"
        out[form] = a
    return out


SHIPPED_UNKNOWN = ("no shipped tables reported for this image yet (a worker reports them at start): the layer value "
                   "would list only the overlay, which would REPLACE the shipped table")
# the merged file over tables nobody reported is the overlay alone: set as the value, it replaces the shipped table
MERGED_UNKNOWN = ("no shipped tables reported for this image yet (a worker reports them at start): the merged file "
                  "would be the overlay alone, which would REPLACE the shipped table")


def why_not(arts: dict[str, Artifact], shipped_known: bool) -> dict[str, str | None]:
    """Per form, why it is not offered (None: offered): what AITER would do with it, and the layer's value without
    the image's tables (it would list the overlay alone and replace the shipped table)."""
    out = {f: arts[f].refused for f in FORMS}
    if not shipped_known:
        out["layer"] = SHIPPED_UNKNOWN
        out["merged"] = out["merged"] or MERGED_UNKNOWN
    return out


def first_offered(arts: dict[str, Artifact], shipped_known: bool) -> str | None:
    """The plan's first offered form: the one the engagement check, the page and a proof default to."""
    return next((f for f, why in why_not(arts, shipped_known).items() if why is None), None)


def _notes(family: TableFamily, arts: dict[str, Artifact], raced: tuple[tuple[str, str, int], ...],
           shipped_known: bool) -> list[str]:
    """The plan's notes: how AITER reads the variable, the family's own notes, what the torch backend's rows
    serve, a compiled table's rebuild, and every form not offered with why."""
    notes = [
        f"Setting {family.env_var} replaces the shipped table: the 'layer' value lists the image's default and "
        "model_configs tables first, joined by ':' (a comma is not a separator).",
        "Set it before `import aiter` and restart the server: AITER caches tables per process. A multi-path value "
        f"is merged into /tmp/aiter_configs/{family.merge_name}.csv, shared by every process on the host.",
        "Set AITER_LOG_TUNED_CONFIG=1 before import to log tuned hits, then POST the log to /v1/engagement/logs "
        "to count hits and misses per shape.",
        *family.deploy_notes,
    ]
    served = dict(family.served_as)
    for backend, libtype, n in raced:
        if backend == "torch" and libtype in served:  # workers/backends/torch_race.py races other kernels
            notes.append(
                f"{n} row(s) raced by the torch backend as libtype={libtype}: AITER serves such a row as "
                f"{served[libtype]}, not the kernel the race timed (a pre-transposed matmul, this project's Triton "
                "configs), so the race's gain does not carry into the served path: its us is the race's kernel's, "
                "and the served call runs at about the default's speed until the row is re-tuned by AITER's tuner.")
    if family.compiled:
        notes.append(f"{family.name} kernels come from a table compiled into AITER's CK JIT module: deploy with "
                     f"AITER_REBUILD=1 in this image, with {family.env_var} already set so the overlay is visible at "
                     "build time (without a rebuild splitK and kernel mismatch, or a name-keyed kernel is missing).")
    if not shipped_known:  # the layer value would list the overlay alone, the merged file be it: neither offered
        notes[:0] = [f"not offered: layer: {SHIPPED_UNKNOWN}"] + (
            [f"not offered: merged: {MERGED_UNKNOWN}"] if arts["merged"].refused is None else [])
    for f in FORMS:
        if arts[f].refused:
            notes.append(f"not offered: {f}: {arts[f].refused}")
        if arts[f].excluded_shipped:
            notes.append(f"{f}: deploys the overlay downloaded with exclude_shipped=true, without its "
                         f"{arts[f].excluded_shipped} row(s) whose key the image ships (the full overlay: "
                         f"{arts[f].full_refused}); the shipped rows stay, the merged file is where ours win")
    return notes


# where the image's configs folder is unknown (no worker reported it), the plan's paths name it with this
# placeholder: something to read, never a value to set (a version refuses it, app/services/ab.py make_version)
UNKNOWN_CONFIGS = "<aiter package>/aiter/configs"


def plan(family: TableFamily, configs_dir: str | None, arts: dict[str, Artifact], overlay_name: str,
         mount: str = "/overlays", raced: tuple[tuple[str, str, int], ...] = (), shipped_known: bool = True
         ) -> dict[str, Any]:
    """raced: (backend, libtype, rows) of the overlay's rows (the served path of the torch backend's rows is noted);
    shipped_known: the image's worker reported its tables (else the layer form is not offered)."""
    base = configs_dir or UNKNOWN_CONFIGS

    def path(name: str) -> str:
        return f"{mount}/{name}" if name == overlay_name or name.startswith("merged_") else f"{base}/{name}"
    layer = arts["layer"]
    notes = _notes(family, arts, raced, shipped_known)
    refused = why_not(arts, shipped_known)
    offered = [f for f in FORMS if refused[f] is None]
    merged_name = arts["merged"].files[0] if arts["merged"].files else f"merged_{overlay_name}"
    return {
        "family": family.name, "env_var": family.env_var, "offered": offered,
        "download": "GET /v1/overlays/{image_digest}/" + family.name + ".csv?form=<form>: the file each form deploys",
        "layer": {"env": f"{family.env_var}={':'.join(path(n) for n in layer.files)}",
                  "files": [path(n) for n in layer.files], "overlay": f"{mount}/{overlay_name}",
                  "offered": refused["layer"] is None, "why_not": refused["layer"],
                  "exclude_shipped": bool(layer.excluded_shipped)},
        "merged": {"env": f"{family.env_var}={mount}/{merged_name}", "file": f"{mount}/{merged_name}",
                   "offered": refused["merged"] is None, "why_not": refused["merged"]},
        "model_configs_dropin": {"copy_to": f"{base}/model_configs/{overlay_name}",
                                 "why": "merged with no env var set: the name contains "
                                        f"'{family.merge_name}' and not 'untuned'",
                                 "offered": arts["model_configs_dropin"].refused is None,
                                 "why_not": arts["model_configs_dropin"].refused,
                                 "exclude_shipped": bool(arts["model_configs_dropin"].excluded_shipped)},
        "rebuild": "AITER_REBUILD=1" if family.compiled else None,
        "log_hits": "AITER_LOG_TUNED_CONFIG=1",
        "notes": notes,
        "shipped_tables_known": shipped_known,
    }


def first_step(plan: dict[str, Any]) -> dict[str, Any]:
    """What a person is told to do, from the plan alone (the campaign page renders this, never its own line):
    the first offered form's setting or copy, and every form not offered with why."""
    refused = [(f, plan[f]["why_not"]) for f in FORMS if not plan[f]["offered"]]
    if not plan["offered"]:
        return {"form": None, "line": None, "copy_to": None, "refused": refused}
    form = plan["offered"][0]
    if form == "model_configs_dropin":
        return {"form": form, "line": None, "copy_to": plan[form]["copy_to"], "refused": refused}
    return {"form": form, "line": plan[form]["env"], "copy_to": None, "refused": refused}


def without_shipped_keys(release: AiterRelease, family: TableFamily, shipped: Shipped, overlay: Table,
                         live_gfx: str, keys: tuple[str, ...] | None = None) -> list[dict[str, str]]:
    """The overlay's rows whose merge key (or these key columns), cells filled as AITER fills them, no shipped
    table has."""
    tables, memo = shipped.tables, shipped.memo
    if not tables:
        return list(overlay.rows)
    header = union_header([*tables, overlay])
    keys = keys or release.merge_key(shipped.untuned_header or family.untuned_header, header)
    have = memo.value(("keys", header, keys, live_gfx), tuple(tables), lambda: {
        k for t in tables for k in memo.per_row(("key", keys), filled_rows(t, header, live_gfx, memo),
                                                 lambda r: row_key(keys, r))})
    return [r for r, f in zip(overlay.rows, filled_rows(overlay, header, live_gfx)) if row_key(keys, f) not in have]


def shipped_rows(release: AiterRelease, family: TableFamily, shipped: Shipped, rows: Table, live_gfx: str
                 ) -> list[dict[str, str] | None]:
    """For each of rows' rows, the shipped row with its merge key (cells filled as AITER fills them; the last one
    in file order), else None: the rows an overlay must not repeat (an image upgrade's triage)."""
    tables = shipped.tables
    if not tables:
        return [None] * len(rows.rows)
    header = union_header([*tables, rows])
    keys = release.merge_key(shipped.untuned_header or family.untuned_header, header)
    have = {row_key(keys, f): r for t in tables
            for r, f in zip(t.rows, filled_rows(t, header, live_gfx, shipped.memo))}
    return [have.get(row_key(keys, f)) for f in filled_rows(rows, header, live_gfx)]
