"""Overlay CSVs, the deploy line to paste, the image's shipped tables, post-deploy log checks."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Response

from app.api.deps import DbDep
from app.schemas import ImageTablesIn, LogIn, VerificationIn, check_digest
from app.api.responses import DeployPlan, FamilySchema, LogReport, OverlayInfo, TablesStored, Verification
from app.auth import CaptureAuth, ReadAuth, WorkerAuth
from app.errors import Invalid
from app import wire
from app.services import ab, builds, deploy_checks, downloads, engagement, overlays, verifications
from app.services.image_tables import schemas_of
from app.services.table_reports import store_image_tables

router = APIRouter(tags=["overlays"])


def _digest(d: str) -> str:
    try:
        return check_digest(d)
    except ValueError as e:
        raise Invalid(f"image_digest: {e}", "image_digest") from None


@router.get("/v1/overlays/{image_digest}/{family}.csv", response_class=Response,
            responses={200: {"content": {"text/csv": {"schema": {"type": "string"}}}, "description": "the overlay CSV"}})
def overlay_csv(image_digest: str, family: str, db: DbDep, who: ReadAuth, merged: bool = False,
                exclude_shipped: bool = False, form: Literal["layer", "merged", "model_configs_dropin"] | None = None,
                version: str | None = None) -> Response:
    """form: the very file the deploy plan deploys for that form (see /deploy). By default the promoted
    version's file (its serving A/B passed: X-Aiter-Version and X-Aiter-AB-Run name them); where the image has
    none, the shipped tables' state (X-Aiter-Version: shipped, 0 rows); version=latest: the overlay as built now
    (not A/B'd); version=<id>: that version's file. X-Aiter-Note says which, in words."""
    who.check_digest(image_digest)
    with db.session(write=False) as s:
        d = downloads.download(s, _digest(image_digest), family, merged=merged, exclude_shipped=exclude_shipped,
                               form=form, version=version)
    return Response(d.content, media_type="text/csv", headers=d.headers())


@router.get("/v1/overlays/{image_digest}/{family}", response_model=OverlayInfo)
def overlay_info(image_digest: str, family: str, db: DbDep, who: ReadAuth) -> dict:
    who.check_digest(image_digest)
    with db.session(write=False) as s:
        ov = overlays.build(s, _digest(image_digest), family)
    name = overlays.overlay_filename(ov.family, image_digest)
    return {"family": ov.family.name, "env_var": ov.family.env_var, "rows": len(ov.table.rows),
            "header": list(ov.schema.header), "schema_known": ov.schema.known, "filename": name,
            "env_line": f"{ov.family.env_var}=/overlays/{name}",
            "download": f"/v1/overlays/{image_digest}/{ov.family.name}.csv",
            "provisional_rows": ov.provisional, "carried_from": ov.carried_from if ov.carried_from and who.may_see(ov.carried_from) else None}


@router.get("/v1/overlays/{image_digest}/{family}/deploy", response_model=DeployPlan)
def deploy_plan(image_digest: str, family: str, db: DbDep, who: ReadAuth, version: str | None = None) -> dict:
    """The exact env value to set (layer over the shipped tables, or one merged file), rebuild and log notes;
    version: as for the download (default the promoted version, else the shipped state; 'latest' the overlay as
    built now, not A/B'd): `served` and the first note say what the download serves."""
    who.check_digest(image_digest)
    with db.session(write=False) as s:
        return downloads.deploy_plan(s, _digest(image_digest), family, version)


@router.post("/v1/verifications", status_code=201, response_model=Verification)
def post_verification(body: VerificationIn, db: DbDep, who: WorkerAuth) -> dict:
    """A worker's replay of the deployed overlay through AITER's production op (tuner --run_config)."""
    who.check_digest(body.image_digest)
    with db.session() as s:
        return verifications.record(s, body)


@router.post("/v1/builds", status_code=201, response_model=wire.BuildOut)
def post_build(body: wire.BuildIn, db: DbDep, who: WorkerAuth) -> dict:
    """A worker's compile lane: seconds spent warming AITER's JIT build, outside any lease."""
    who.check_digest(body.image_digest)
    with db.session() as s:
        return builds.record(s, body)


@router.get("/v1/overlays/{image_digest}/{family}/verifications", response_model=list[Verification])
def list_verifications(image_digest: str, family: str, db: DbDep, who: ReadAuth) -> list[dict]:
    who.check_digest(image_digest)
    with db.session(write=False) as s:
        return verifications.listing(s, _digest(image_digest), family)


@router.put("/v1/images/{image_digest}/tables", response_model=TablesStored)
def put_tables(image_digest: str, body: ImageTablesIn, db: DbDep, who: WorkerAuth) -> dict:
    who.check_digest(image_digest)
    with db.session() as s:
        return {"image_digest": image_digest, "stored": store_image_tables(s, _digest(image_digest), body)}


@router.get("/v1/images/{image_digest}/schemas", response_model=list[FamilySchema])
def get_schemas(image_digest: str, db: DbDep, who: ReadAuth) -> list[dict]:
    """Per family: the header, key columns and untuned header this image's AITER uses."""
    who.check_digest(image_digest)
    with db.session(write=False) as s:
        return schemas_of(s, _digest(image_digest))


@router.post("/v1/engagement/logs", response_model=LogReport)
def post_deploy_log(body: LogIn, db: DbDep, who: CaptureAuth) -> dict:
    """A server log after deploy: per shape and per rank (the lines' worker prefixes) against the prediction,
    with alerts (a rank that missed the overlay's shapes or built kernels); kept for the campaign page."""
    who.check_digest(body.image_digest)
    with db.session() as s:
        return deploy_checks.record(s, body)
