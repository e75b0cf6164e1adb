"""The serving A/B (issue 32): overlay versions, runs, the driver's passes, booking and promotion."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.ab_wire import ArmIn, FaultIn, PassIn, RunIn, VersionIn
from app.api.deps import DbDep, IdPath
from app.api.responses import AbArmStored, AbPassStored, AbRun, AbRunBrief, AbVersion
from app.api.schemas import check_digest
from app.auth import AdminAuth, CaptureAuth, ReadAuth
from app.errors import Invalid
from app.services import ab

router = APIRouter(tags=["ab"])


def _digest(d: str) -> str:
    try:
        return check_digest(d)
    except ValueError as e:
        raise Invalid(f"image_digest: {e}", "image_digest") from None


@router.post("/v1/ab/versions", status_code=201, response_model=AbVersion)
def create_version(body: VersionIn, response: Response, db: DbDep, who: CaptureAuth) -> dict:
    """Freeze the image's overlay as deployed in a form: each file with its sha256 (the same files: the same
    version, answered 200)."""
    who.check_digest(body.image_digest)
    with db.session() as s:
        out, made = ab.make_version(s, _digest(body.image_digest), body.form, body.families)
    if not made:
        response.status_code = 200
    return out


@router.get("/v1/ab/versions", response_model=list[AbVersion])
def list_versions(image_digest: str, db: DbDep, who: ReadAuth) -> list[dict]:
    who.check_digest(image_digest)
    with db.session(write=False) as s:
        return ab.versions(s, _digest(image_digest))


@router.get("/v1/ab/versions/{version_id}", response_model=AbVersion)
def get_version(version_id: IdPath, db: DbDep, who: ReadAuth) -> dict:
    with db.session(write=False) as s:
        v = ab.get_version(s, version_id)
        who.check_digest(v.image_digest)
        return ab.version_dict(v)


@router.get("/v1/ab/versions/{version_id}/{family}.csv", response_class=Response,
            responses={200: {"content": {"text/csv": {"schema": {"type": "string"}}}, "description": "the file"}})
def version_csv(version_id: IdPath, family: str, db: DbDep, who: ReadAuth) -> Response:
    """The file the version deploys for a family, byte for byte (its sha256 is the version's)."""
    with db.session(write=False) as s:
        v, f = ab.version_file(s, version_id, family)
        who.check_digest(v.image_digest)
    return Response(f["content"], media_type="text/csv", headers={
        "Content-Disposition": f'attachment; filename="{f["name"]}"', "X-Aiter-Env": f["env_var"],
        "X-Aiter-Sha256": f["sha256"], "X-Aiter-Version": str(v.id)})


@router.post("/v1/ab/runs", status_code=201, response_model=AbRun)
def create_run(body: RunIn, db: DbDep, who: CaptureAuth) -> dict:
    who.check_digest(body.image_digest)
    _digest(body.image_digest)
    with db.session() as s:
        return ab.create_run(s, body)


@router.get("/v1/ab/runs", response_model=list[AbRunBrief])
def list_runs(db: DbDep, who: ReadAuth, image_digest: str | None = None) -> list[dict]:
    if image_digest is not None:
        who.check_digest(image_digest)
    with db.session(write=False) as s:
        return [r for r in ab.runs(s, image_digest) if who.may_see(r["image_digest"])]


def _run(s, run_id: IdPath, who) -> None:  # type: ignore[no-untyped-def]
    who.check_digest(ab.get_run(s, run_id).image_digest)


@router.get("/v1/ab/runs/{run_id}", response_model=AbRun)
def get_run(run_id: IdPath, db: DbDep, who: ReadAuth) -> dict:
    with db.session(write=False) as s:
        _run(s, run_id, who)
        return ab.run_dict(s, ab.get_run(s, run_id))


@router.post("/v1/ab/runs/{run_id}/start", response_model=AbRun)
def start_run(run_id: IdPath, db: DbDep, who: CaptureAuth) -> dict:
    """A driver begins or resumes the run (an interrupted run's fault is cleared; its passes stay)."""
    with db.session() as s:
        _run(s, run_id, who)
        return ab.start(s, run_id)


@router.post("/v1/ab/runs/{run_id}/passes", status_code=201, response_model=AbPassStored)
def post_pass(run_id: IdPath, body: PassIn, response: Response, db: DbDep, who: CaptureAuth) -> dict:
    with db.session() as s:
        _run(s, run_id, who)
        out, stored = ab.post_pass(s, run_id, body)
    if not stored:
        response.status_code = 200
    return out


@router.post("/v1/ab/runs/{run_id}/arms", response_model=AbArmStored)
def post_arm(run_id: IdPath, body: ArmIn, db: DbDep, who: CaptureAuth) -> dict:
    with db.session() as s:
        _run(s, run_id, who)
        return ab.post_arm(s, run_id, body)


@router.post("/v1/ab/runs/{run_id}/interrupt", response_model=AbRun)
def interrupt_run(run_id: IdPath, body: FaultIn, db: DbDep, who: CaptureAuth) -> dict:
    with db.session() as s:
        _run(s, run_id, who)
        return ab.interrupt(s, run_id, body.reason)


@router.post("/v1/ab/runs/{run_id}/finish", response_model=AbRun)
def finish_run(run_id: IdPath, db: DbDep, who: CaptureAuth) -> dict:
    """Book the run once every pass is measured: verdicts per band, the control, engagement, accuracy."""
    with db.session() as s:
        _run(s, run_id, who)
        return ab.finish(s, run_id)


@router.post("/v1/ab/runs/{run_id}/promote", response_model=AbVersion)
def promote(run_id: IdPath, db: DbDep, who: AdminAuth) -> dict:
    """Promote the run's version: only when the run is booked, not void, and no band regresses or is void."""
    with db.session() as s:
        _run(s, run_id, who)
        return ab.promote(s, run_id)
