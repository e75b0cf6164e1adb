"""What the overlay download serves (issue 49): the image's promoted version by default (its serving A/B
passed), the shipped tables' state where none is promoted, and the overlay as built now only when asked for by
name (version=latest: not A/B'd). A deploy that mounts the download therefore never serves rows no A/B passed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from app.db.models import OverlayVersion
from app.errors import Conflict
from app.services import ab, overlays

LATEST, SHIPPED = "latest", "shipped"
NOT_AB = "not A/B'd: the overlay as built now, no serving A/B passed on it"
NONE_PROMOTED = ("no promoted version of this image holds this family: the shipped tables' state (a layer file "
                 "with the header alone, 0 rows, adds nothing to what AITER ships); version=latest serves the "
                 "overlay as built now (not A/B'd)")


@dataclass(frozen=True)
class Download:
    content: str
    filename: str
    env_var: str
    rows: int
    version: str  # a version id, LATEST or SHIPPED
    note: str
    form: str | None = None
    sha256: str | None = None
    ab_run: int | None = None

    def headers(self) -> dict[str, str]:
        out = {"Content-Disposition": f'attachment; filename="{self.filename}"', "X-Aiter-Env": self.env_var,
               "X-Aiter-Rows": str(self.rows), "X-Aiter-Version": self.version, "X-Aiter-Note": self.note}
        if self.version not in (LATEST, SHIPPED):
            out |= {"X-Aiter-Sha256": self.sha256 or "", "X-Aiter-AB-Run": str(self.ab_run or ""),
                    "X-Aiter-Form": self.form or ""}
        return out


def asked_form(merged: bool, form: str | None) -> str | None:
    return form or ("merged" if merged else None)


def _of_version(v: OverlayVersion, f: dict, asked: str | None, field: str) -> Download:
    """A version holds one file per family, in the form it was frozen in: another form is refused, never made
    up (a layer version's file already leaves out the keys the image ships: exclude_shipped asks nothing more)."""
    if asked not in (None, v.form):
        raise Conflict(f"{field}: version {v.id} is frozen as {v.form!r} and holds only that file; ask for it "
                       f"without {field}, or version=latest for the overlay as built now as {asked!r} ({NOT_AB})",
                       field)
    note = (f"version {v.id}, {v.state}" + (f", promoted by A/B run {v.promoted_run_id}" if v.promoted_run_id
                                            else ", not promoted"))
    return Download(f["content"], f["name"], f["env_var"], f["rows"], str(v.id), note, v.form, f["sha256"],
                    v.promoted_run_id)


def _shipped_state(s: Session, digest: str, family: str, merged: bool, form: str | None) -> Download:
    """The download where nothing is promoted: the same file name and form, holding what AITER ships alone."""
    ov = overlays.build(s, digest, family)
    empty = ov.memo("shipped_state", lambda: overlays.without_rows(ov))
    if asked_form(merged, form) is not None and not ov.shipped.known:
        # a merged (or drop-in) file of nothing would be the header alone, and as the env var's only file it
        # replaces what the image ships: the shipped state is then no file at all
        raise Conflict(f"{asked_form(merged, form)}: no promoted version, and the image's tables are unknown (its "
                       "worker has not reported them): leave the env var unset to serve what AITER ships",
                       "form" if form else "merged")
    served = overlays.deployable_of(empty, merged=merged, form=form)
    name = overlays.overlay_filename(ov.family, digest)
    return Download(served.csv(), f"merged_{name}" if asked_form(merged, form) == "merged" else name,
                    ov.family.env_var, 0, SHIPPED, NONE_PROMOTED)


def download(s: Session, digest: str, family: str, merged: bool = False, exclude_shipped: bool = False,
             form: str | None = None, version: str | None = None) -> Download:
    """version: None the promoted version's file (else the shipped state), LATEST the overlay as built now,
    a number that version's file."""
    asked = asked_form(merged, form)
    field = "form" if form else "merged"
    if version == LATEST:
        ov = overlays.deployable(s, digest, family, merged=merged, exclude_shipped=exclude_shipped, form=form)
        name = overlays.overlay_filename(ov.family, digest)
        return Download(ov.csv(), f"merged_{name}" if asked == "merged" else name, ov.family.env_var,
                        len(ov.table.rows), LATEST, NOT_AB)
    v, f = ab.serving(s, digest, family, version)
    if v is not None and f is not None:
        return _of_version(v, f, asked, field)
    return _shipped_state(s, digest, family, merged, form)


def deploy_plan(s: Session, digest: str, family: str, version: str | None = None) -> dict[str, Any]:
    """overlays.deploy_plan, saying what the download serves under the same `version`: `served` (version,
    note) and the plan's first note; `version` the served version's file where one is (else None)."""
    out = overlays.deploy_plan(s, digest, family)
    v, f = (None, None) if version == LATEST else ab.serving(s, digest, family, version)
    if v is not None and f is not None:
        out["version"] = {"id": v.id, "state": v.state, "form": v.form, "ab_run": v.promoted_run_id,
                          "file": f["name"], "sha256": f["sha256"], "rows": f["rows"],
                          "download": f"GET /v1/ab/versions/{v.id}/{family}.csv",
                          "env": f"{f['env_var']}=" + ":".join(
                              f"/overlays/{f['name']}" if p == ab.OVERLAY_MARK else p for p in f["paths"])}
        note = (f"serving version {v.id} ({v.state}" + (f", promoted by A/B run {v.promoted_run_id}"
                                                        if v.promoted_run_id else "")
                + f"): its {v.form} file is what the overlay download serves" + (" by default" if version is None
                                                                                else ""))
        out["served"] = {"version": str(v.id), "note": note}
    else:
        out["version"] = None
        shown = LATEST if version == LATEST else SHIPPED
        note = (f"version=latest: the download serves the overlay as built now, {NOT_AB}" if shown == LATEST
                else f"the download serves {NONE_PROMOTED}")
        out["served"] = {"version": shown, "note": note}
    out["notes"].insert(0, note)
    return out
