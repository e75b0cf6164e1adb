"""Response models of the read and admin routes (the worker's are in app/wire.py), and the error body.

Reports carry more than these fields (they grow with the features that fill them): each model declares what a
client may rely on and allows the rest, so the OpenAPI document states every route's answer.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Problem(BaseModel):
    """application/problem+json (RFC 9457) with the field at fault."""

    title: str
    status: int
    detail: str
    field: str | None = None


class Health(BaseModel):
    ok: bool


class CampaignSummary(Open):
    campaign_id: int
    image_digest: str
    gfx: str
    cu_num: int
    family: str
    shapes: int
    queued: int
    leased: int
    tuned: int
    failed: int
    default_best: int = 0  # tuned with no row: nothing beat the default by AITER's margin
    tuned_with_row: int = 0
    build_s: float = 0.0  # compile lane: JIT build seconds for this image and family, apart from race time


class DemandFamily(Open):
    campaign_id: int
    family: str
    queued_shapes: int
    leased_shapes: int
    est_shape_cost_s: float  # the campaign's own figure: median race seconds of its results, else the default
    cost_basis: str


class DemandIdentity(Open):
    image_digest: str
    gfx: str
    cu_num: int
    queued_shapes: int
    leased_shapes: int  # held by running workers: not work for new ones
    gpu_s_queued_est: float  # device seconds the queued shapes are estimated to take (CPU seconds for gfx=cpu)
    families: list[DemandFamily]


class DemandTotals(BaseModel):
    queued_shapes: int
    leased_shapes: int
    gpu_s_queued_est: float


class Demand(BaseModel):
    identities: list[DemandIdentity]
    total: DemandTotals


class ShapePage(Open):
    shapes: list[dict[str, Any]]
    next: str | int | None = None


class CampaignDetail(CampaignSummary):
    # an inherited campaign (its image upgrades another): carried / confirmed / overturned / re-raced / now
    # shipped rows, and its race time against the parent campaign's (app/services/upgrades.py); null otherwise
    upgrade: dict[str, Any] | None = None
    shape_list: list[dict[str, Any]]
    next: str | int | None = None


class EngagementReport(Open):
    campaign_id: int
    family: str
    env_var: str
    form: str  # the deploy form the verdict is on (or "supplied")
    release: str  # the AITER release whose rules built and read the table
    refused: str | None = None  # why AITER raises on this form (then nothing engages)
    shapes: int  # captured shapes, every page
    # Totals over every shape, not the page. A large campaign's are counted after its first view, off the
    # request (app/services/page_totals.py): until then they are null, never 0; once shapes, results or the
    # proof moved on, the last count is shown with its age. Either way totals_pending is true.
    hits: int | None = Field(description="shapes whose key AITER finds (null: not counted yet)")
    misses: int | None = Field(description="shapes AITER runs its default kernel for (null: not counted yet)")
    raises: int | None = Field(None, description=(
        "shapes on which AITER raises (a row whose kernel it cannot run, a default path that asserts): the "
        "server would crash on those calls; each report row's `verdict` is hit, miss, raises or unknown"))
    unknown: int | None = Field(None, description=(
        "shapes whose verdict depends on what a capture does not carry (e.g. a bpreshuffle weight padded past the "
        "activation's K): the row's reason says `unknown: depends on ...`"))
    served_time_covered: float | None = Field(
        description="share of the campaign's served time on hitting shapes (null: not counted yet)")
    totals_pending: bool = Field(
        False, description="the totals are not of the campaign as it is now: null (counting) or stale; ask again")
    totals_stale_s: float | None = Field(
        None, description="the totals shown were counted this many seconds ago, on an older state (else null)")
    proof: dict[str, Any] | None = Field(None, description=(
        "the latest workers.verify --engagement run in the image, if any; its `disagreements` with the "
        "prediction over every shape is a total (null while totals_pending without a count)"))
    report: list[dict[str, Any]] = Field(description="one page of shapes (limit, after), each with its verdict")
    next: str | None = Field(None, description="the cursor of the report's next page (`after`); null: the last")


class ProofRecorded(Open):
    id: int
    campaign_id: int
    form: str
    shapes: int
    hits: int


class BucketPlan(Open):
    campaign_id: int
    family: str
    rows_to_tune: int
    rows: list[dict[str, Any]]


class BucketApply(Open):
    added: int
    covered: int


class Requeued(BaseModel):
    requeued: int


class WorkerInfo(Open):
    worker_id: str
    image_digest: str
    gfx: str
    cu_num: int
    stale: bool
    lease_id: str | None = None


class Inherited(Open):
    image_digest: str
    from_: str = Field(alias="from")
    campaigns: list[dict[str, Any]]


class Lineage(Open):
    image_digest: str
    parent: str | None
    children: list[str]
    suggested_from: list[str]  # images the hosts now running this one ran before (while it has no parent)


class OverlayInfo(Open):
    family: str
    env_var: str
    rows: int
    header: list[str]
    filename: str
    env_line: str
    download: str
    provisional_rows: int = 0  # rows carried from the parent image (carried_from), not yet confirmed here
    carried_from: str | None = None


class DeployPlan(Open):
    family: str
    env_var: str
    notes: list[Any]


class Verification(Open):
    id: int
    image_digest: str
    family: str
    worker_id: str
    passed: bool
    created_at: str


class FamilySchema(Open):
    family: str
    header: list[str]
    key_columns: list[str]
    untuned_header: list[str]


class TablesStored(Open):
    image_digest: str
    stored: dict[str, Any]


class LogReport(Open):
    family: str
    env_var: str
    hit_lines: int
    miss_lines: int
    report: list[dict[str, Any]]


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error codes, each a Problem as application/problem+json."""
    why = {400: "bad request", 401: "no or unknown token", 403: "token lacks the role or digest scope",
           404: "not found", 409: "conflict with the current state", 413: "body too large",
           415: "unsupported content type", 422: "invalid input (the field is named)",
           503: "database busy or unavailable (Retry-After)"}
    return {c: {"description": why.get(c, "error"), "model": Problem,
                "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}
            for c in codes}


def csv_body(what: str) -> dict[str, Any]:
    """openapi_extra for a route that reads a raw text/csv body."""
    return {"requestBody": {"required": True, "description": what,
                            "content": {"text/csv": {"schema": {"type": "string"}}}}}


class AbVersion(Open):
    """An overlay version: the files of one deploy form, each with its sha256 (issue 32)."""
    id: int
    image_digest: str
    form: str
    state: str
    files: list[dict[str, Any]]


class AbRun(Open):
    """A serving A/B run: its state, verdict (void with the reason where it is), bands, the passes still to
    measure, and its result once booked."""
    id: int
    image_digest: str
    version_id: int
    state: str
    verdict: str | None
    points: list[dict[str, Any]]


class AbRunBrief(Open):
    id: int
    image_digest: str
    version_id: int
    state: str
    verdict: str | None


class AbPassStored(Open):
    stored: bool
    pass_id: int


class AbArmStored(Open):
    arm: str
    ranks: list[str]
