"""Campaigns, their shapes, workers, and the pre-deploy engagement check."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Query, Request
from starlette.concurrency import run_in_threadpool

from app.api.deps import DbDep, IdPath, SettingsDep
from app.api.responses import (BucketApply, BucketPlan, CampaignDetail, CampaignSummary, Demand, EngagementReport,
                               ProofRecorded, Requeued, ShapePage, WorkerInfo, csv_body)
from app.schemas import EngagementProofIn, check_digest
from app.auth import AdminAuth, Principal, ReadAuth, WorkerAuth
from app.errors import Invalid
from app.services import buckets, campaigns, demand, engagement, leasing, lookups, pages, upgrades

router = APIRouter(tags=["campaigns"])


def _scoped(s, who: Principal, campaign_id: int) -> None:  # type: ignore[no-untyped-def]
    """The campaign exists and the token's digest scope covers it (reads and admin actions alike)."""
    who.check_digest(lookups.campaign_or_404(s, campaign_id).image_digest)


@router.get("/v1/campaigns", response_model=list[CampaignSummary])
def list_campaigns(db: DbDep, settings: SettingsDep, who: ReadAuth) -> list[dict]:
    with db.session(write=False) as s:
        return [c for c in campaigns.summaries(s, settings.default_shape_cost_s) if who.may_see(c["image_digest"])]


@router.get("/v1/demand", response_model=Demand)
def get_demand(db: DbDep, settings: SettingsDep, who: ReadAuth,
               image_digest: Annotated[str | None, Query(max_length=80)] = None,
               gfx: Annotated[str | None, Query(max_length=40)] = None, cu_num: int | None = None) -> dict:
    """Work queued per worker identity (image digest, gfx, cu_num): shapes and estimated device seconds, for an
    autoscaler (KEDA's metrics-api trigger reads `total.gpu_s_queued_est` or `total.queued_shapes`); a scoped
    token sees its images only. The same figures are the aiter_tuner_queued_* gauges on /metrics."""
    if image_digest is not None:
        try:
            image_digest = check_digest(image_digest)
        except ValueError as e:
            raise Invalid(f"image_digest: {e}", "image_digest") from None
    with db.session(write=False) as s:
        return demand.demand(s, settings.default_shape_cost_s, who.digests, image_digest, gfx, cu_num)


Limit = Annotated[int, Query(description="shapes per page")]
After = Annotated[str | None, Query(max_length=200, description="the `next` cursor of the previous page")]


@router.get("/v1/campaigns/{campaign_id}", response_model=CampaignDetail)
def get_campaign(campaign_id: IdPath, db: DbDep, settings: SettingsDep, who: ReadAuth,
                 limit: Limit = pages.DEFAULT_LIMIT, after: After = None) -> dict:
    """The summary and one page of shapes by served time (`next`: the cursor of the following page)."""
    with db.session(write=False) as s:
        _scoped(s, who, campaign_id)
        summary = campaigns.summary(s, settings.default_shape_cost_s, campaign_id)
        rows, nxt = campaigns.shapes(s, campaign_id, pages.check_limit(limit), after)
        return {**summary, "upgrade": upgrades.counts(s, campaign_id, who.may_see), "shape_list": rows, "next": nxt}


@router.get("/v1/campaigns/{campaign_id}/shapes", response_model=ShapePage)
def list_shapes(campaign_id: IdPath, db: DbDep, who: ReadAuth, limit: Limit = pages.DEFAULT_LIMIT,
                after: After = None) -> dict:
    with db.session(write=False) as s:
        _scoped(s, who, campaign_id)
        rows, nxt = campaigns.shapes(s, campaign_id, pages.check_limit(limit), after)
        return {"shapes": rows, "next": nxt}


@router.get("/v1/campaigns/{campaign_id}/engagement", response_model=EngagementReport)
def get_engagement(campaign_id: IdPath, db: DbDep, who: ReadAuth, later: BackgroundTasks, merged: bool = False,
                   form: str | None = None, limit: Limit = pages.DEFAULT_LIMIT, after: After = None) -> dict:
    """The verdict per captured shape on the table AITER builds from a deploy form (layer, merged,
    model_configs_dropin; default: the deploy plan's first offered form); the report one page at a time, its
    totals over every shape counted after the first view of a large campaign (`totals_pending`)."""
    with db.session(write=False) as s:
        _scoped(s, who, campaign_id)
        report, start = engagement.pre_deploy(s, campaign_id, merged=merged, form=form,
                                              limit=pages.check_limit(limit), after=after, db=db)
    return _counting_after(report, start, later)


def _counting_after(report: dict, start, later: BackgroundTasks) -> dict:  # type: ignore[no-untyped-def]
    if start is not None:  # the totals' count, after the report is sent
        later.add_task(start)
    return report


@router.post("/v1/campaigns/{campaign_id}/engagement/proofs", status_code=201, response_model=ProofRecorded)
def post_engagement_proof(campaign_id: IdPath, body: EngagementProofIn, db: DbDep, who: WorkerAuth) -> dict:
    """AITER's own lookup run in the served image (aiter-tuner verify --engagement), per captured shape."""
    with db.session() as s:
        who.check_digest(lookups.campaign_or_404(s, campaign_id).image_digest)
        return engagement.record_proof(s, campaign_id, body)


@router.post("/v1/campaigns/{campaign_id}/engagement", response_model=EngagementReport,
             openapi_extra=csv_body("the table to check, as written (AITER tuned CSV)"))
async def check_supplied_table(campaign_id: IdPath, request: Request, db: DbDep, who: ReadAuth, later: BackgroundTasks,
                               limit: Limit = pages.DEFAULT_LIMIT, after: After = None) -> dict:
    """Would this CSV (as written) engage in the campaign's image? Body: the table, text/csv."""
    text = (await request.body()).decode("utf-8", errors="replace")

    def work() -> dict:  # CSV parsing and the database: off the event loop
        with db.session(write=False) as s:
            _scoped(s, who, campaign_id)
            report, start = engagement.pre_deploy(s, campaign_id, table_csv=text, limit=pages.check_limit(limit),
                                                  after=after, db=db)
        return _counting_after(report, start, later)

    return await run_in_threadpool(work)


@router.get("/v1/campaigns/{campaign_id}/bucket-plan", response_model=BucketPlan)
def bucket_plan(campaign_id: IdPath, db: DbDep, who: ReadAuth) -> dict:
    with db.session(write=False) as s:
        _scoped(s, who, campaign_id)
        return buckets.report(s, campaign_id)


@router.post("/v1/campaigns/{campaign_id}/bucket-plan/apply", response_model=BucketApply)
def apply_bucket_plan(campaign_id: IdPath, db: DbDep, who: AdminAuth) -> dict:
    with db.session() as s:
        _scoped(s, who, campaign_id)
        return buckets.apply(s, campaign_id)


@router.post("/v1/campaigns/{campaign_id}/requeue-failed", response_model=Requeued)
def requeue_failed(campaign_id: IdPath, db: DbDep, who: AdminAuth) -> dict:
    with db.session() as s:
        _scoped(s, who, campaign_id)
        return {"requeued": leasing.requeue_campaign_failures(s, campaign_id)}


@router.get("/v1/workers", response_model=list[WorkerInfo])
def list_workers(db: DbDep, settings: SettingsDep, who: ReadAuth) -> list[dict]:
    with db.session(write=False) as s:
        return [w for w in campaigns.workers(s, settings.stale_worker_s) if who.may_see(w["image_digest"])]
