"""Server-rendered dashboard: home, campaign and workers pages, with a small polling refresh."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.background import BackgroundTask

from app.api.deps import DbDep, IdPath, SettingsDep
from app.auth import COOKIE, ReadAuth, resolve
from app.config import Settings
from app.db.models import Campaign
from app.db.session import Database
from app.domain import deploy
from app.domain.families import get_family
from app.errors import Forbidden
from app.services import ab, campaign_page as page_engagement, campaigns, deploy_checks, lookups, overlays, \
    verifications, upgrades
from app.domain.roofline import processor
from app.web.plots import ab_svg, coverage_svg

log = logging.getLogger(__name__)
router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
STATIC = Path(__file__).parent / "static"


def _fmt_s(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v / 3600:.1f} h" if v >= 3600 else (f"{v / 60:.1f} min" if v >= 60 else f"{v:.1f} s")


def _ago(v: float | None) -> str:
    """An age as a live page shows it: in whole minutes, so its tag (which has this text) moves once a minute."""
    m = int((v or 0) // 60)
    return "under a minute ago" if m < 1 else (f"{m} min ago" if m < 60 else f"{m // 60} h ago")


templates.env.filters["dur"] = _fmt_s
templates.env.filters["ago"] = _ago
templates.env.filters["processor"] = processor  # gfx -> "GPU" or "CPU": the word for a worker's time there


def _shape_text(shape: dict) -> str:
    """A listed shape as its row shows it, without the fields every shape of a campaign has at their usual value:
    made in one piece (escaped once) where a loop in the template escaped each key and value (the campaign
    page's 200-row table: 12.7 -> 7.9 ms on the 2-core VM, the same HTML)."""
    return "".join(f"{k}={v} " for k, v in shape.items() if v not in ("False", "torch.bfloat16"))


templates.env.filters["shape_text"] = _shape_text


def _pct_iv(d: dict | None) -> str:
    """An effect with its interval, in percent: '+8.1% [+6.9, +9.3]'."""
    if not d or d.get("effect") is None:
        return "-"
    return f"{100 * d['effect']:+.1f}% [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]"


templates.env.filters["pct_iv"] = _pct_iv
for _name in templates.env.list_templates():  # compiled at start, not on the first view (~40 ms)
    templates.env.get_template(_name)  # base.html too: the pages extend it, and it compiles when first rendered


def _tag(data: bytes) -> str:
    return '"' + hashlib.blake2b(data, digest_size=12).hexdigest() + '"'


def _shown_tag(request: Request, shows: object) -> str:
    """A page's tag from what it shows, before it is rendered: its query (partial, after) and shows, the page's
    inputs (the template is a function of them alone: nothing of the clock but what shows holds)."""
    return _tag(json.dumps([request.url.path, str(request.query_params), shows], sort_keys=True,
                           default=str).encode())


def _unchanged(request: Request, tag: str, start: Callable[[], None] | None = None) -> Response | None:
    """The live refresh (static/live.js) sends the tag back: a bodiless 304 while the page is the same; start:
    what a view starts after it is sent (a due count of the totals)."""
    if request.headers.get("if-none-match") != tag:
        return None
    return Response(status_code=304, headers={"ETag": tag}, background=BackgroundTask(start) if start else None)


def _page(request: Request, name: str, ctx: dict, tag: str | None = None) -> Response:
    """The page with its tag: the caller's (_shown_tag, having answered a 304 from it already), else a hash of
    the rendered page."""
    partial = request.query_params.get("partial") == "1"
    page = templates.TemplateResponse(request, name, {**ctx, "partial": partial})
    if tag is None:
        tag = _tag(page.body)  # type: ignore[arg-type]  # a rendered template's body: bytes
        if (same := _unchanged(request, tag)) is not None:
            return same
    page.headers["ETag"] = tag
    return page


@router.get("/", response_class=HTMLResponse)
def home(request: Request, db: DbDep, settings: SettingsDep, who: ReadAuth) -> Response:
    with db.session(write=False) as s:  # a digest-scoped token sees its images only
        camps = [c for c in campaigns.summaries(s, settings.default_shape_cost_s) if who.may_see(c["image_digest"])]
        claims = campaigns.aiter_claims(s)
    images: dict[str, dict] = {}
    for c in camps:
        img = images.setdefault(c["image_digest"], {"digest": c["image_digest"], "aiter_version": c["aiter_version"],
                                                    "aiter_commit": c["aiter_commit"],
                                                    "claimed": claims.get(c["image_digest"], []), "campaigns": []})
        img["campaigns"].append(c)
    shown = list(images.values())
    tag = _shown_tag(request, shown)  # the page is these, rendered
    return _unchanged(request, tag) or _page(request, "index.html", {"images": shown}, tag)


@router.get("/campaigns/{campaign_id}", response_class=HTMLResponse)
def campaign_page(campaign_id: IdPath, request: Request, db: DbDep, settings: SettingsDep, who: ReadAuth,
                  after: str | None = None) -> Response:
    with db.session(write=False) as s:
        who.check_digest(lookups.campaign_or_404(s, campaign_id).image_digest)
        head = _campaign_head(s, db, settings, campaign_id, after, who.may_see)
        tag = _shown_tag(request, head.shows())
        if (same := _unchanged(request, tag, head.verdict.start)) is not None:
            return same  # nothing listed is checked, nothing rendered
        ctx, start_count = _campaign(s, db, head, campaign_id, after)
    page = _page(request, "campaign.html", ctx, tag)
    if start_count is not None:  # after the page is sent
        page.background = BackgroundTask(start_count)
    return page


class _Head(NamedTuple):
    """What the campaign page shows, read before its shapes' verdicts are checked or it is rendered."""
    counts: dict[int, dict[str, campaigns.StateCounts]]
    summary: dict
    checks: list[dict]  # the newest verifications
    listed: tuple  # campaigns.listed_version
    verdict: page_engagement.PageVersion
    versions: list[dict]  # the image's overlay versions holding this family, with their A/B runs (issue 32)
    deployed: dict | None  # the newest post-deploy log check, per rank, with its alerts (issue 49)

    def shows(self) -> list:
        v = self.verdict  # a stale count's age as the page words it: the clock moves the tag once a minute
        return [self.summary, self.checks, self.listed, v.version, v.totals, v.stale_s is not None and _ago(v.stale_s),
                self.versions, self.deployed]


def _campaign_head(s: Session, db: Database, settings: Settings, campaign_id: int, after: str | None,
                   may_see: Callable[[str], bool] = lambda d: True) -> _Head:
    """may_see: the digests the reader's token may learn (the page of a child names no parent it cannot see)."""
    counts = campaigns.shape_counts(s, campaign_id)  # one pass: the summary's and the totals' version's
    summary = {**campaigns.summary(s, settings.default_shape_cost_s, campaign_id, counts),
               "upgrade": upgrades.counts(s, campaign_id, may_see)}
    return _Head(counts, summary, verifications.listing(s, summary["image_digest"], summary["family"])[:3],
                 campaigns.listed_version(s, campaign_id, after=after),
                 page_engagement.page_version(s, db, campaign_id, counts.get(campaign_id, {})),
                 [v for v in ab.versions(s, summary["image_digest"])
                  if any(f["family"] == summary["family"] for f in v["files"])],
                 deploy_checks.latest(s, campaign_id))


def _campaign(s: Session, db: Database, head: _Head, campaign_id: int, after: str | None = None
              ) -> tuple[dict, Callable[[], None] | None]:
    """The campaign page's context, and what starts a due count of its totals."""
    summary = head.summary
    shapes, nxt = campaigns.shapes(s, campaign_id, after=after)
    fam = get_family(summary["family"])
    name = overlays.overlay_filename(fam, summary["image_digest"])
    # only the listed shapes are checked: the totals over every shape are counted off the request
    verdict, start_count = page_engagement.page_summary(s, campaign_id, shapes, db, head.counts.get(campaign_id, {}))
    return {"verifications": head.checks, "deployed": head.deployed, "verdict": verdict, "versions": head.versions,
            "c": summary,
            "shapes": shapes, "next": nxt, "family": fam, "overlay_name": name,
            # what to do with the file is the deploy plan's verdict, never a line of the page's own
            "step": deploy.first_step(overlays.deploy_plan(s, summary["image_digest"], fam.name)),
            # the overlay as built now (the plain download serves the promoted version: issue 49)
            "csv_url": f"/v1/overlays/{summary['image_digest']}/{fam.name}.csv?version=latest",
            "deploy_url": f"/v1/overlays/{summary['image_digest']}/{fam.name}/deploy"}, start_count


WARM_PAGES = 4


def warm_pages(db: Database, settings: Settings, n: int = WARM_PAGES) -> None:
    """The newest n campaigns' pages made once, off any request, after a start (app.main.ready_to_serve runs
    it in a thread): their image's overlay is built (seconds for an image with big shipped tables; then kept,
    overlays.build), the page's statements compiled and its rows read, so the first view after a restart
    costs what any view does. No count of their totals is started."""
    try:
        with db.session(write=False) as s:
            for cid in s.scalars(select(Campaign.id).order_by(Campaign.id.desc()).limit(n)).all():
                _campaign(s, db, _campaign_head(s, db, settings, cid, None), cid)
    except Exception as e:  # a busy or closing database: the first views pay instead
        log.warning("warming the campaign pages failed: %s", e)


@router.get("/campaigns/{campaign_id}/coverage.svg")
def coverage_plot(campaign_id: IdPath, db: DbDep, who: ReadAuth) -> Response:
    with db.session(write=False) as s:
        camp = lookups.campaign_or_404(s, campaign_id)
        who.check_digest(camp.image_digest)
        pts = campaigns.coverage_points(s, campaign_id)
    return Response(coverage_svg(pts, processor(camp.gfx)), media_type="image/svg+xml")


@router.get("/ab/{run_id}", response_class=HTMLResponse)
def ab_page(run_id: IdPath, request: Request, db: DbDep, who: ReadAuth) -> Response:
    """One A/B run: per-band effect, interval and verdict, the identical-arm control, engagement per rank."""
    with db.session(write=False) as s:
        r = ab.run_dict(s, ab.get_run(s, run_id))
    who.check_digest(r["image_digest"])
    r.pop("todo")
    return _page(request, "ab.html", {"r": r, "res": r["result"]})


@router.get("/ab/{run_id}/bands.svg")
def ab_plot(run_id: IdPath, db: DbDep, who: ReadAuth) -> Response:
    with db.session(write=False) as s:
        run = ab.get_run(s, run_id)
        who.check_digest(run.image_digest)
        bands = (run.result or {}).get("bands", [])
    return Response(ab_svg(bands), media_type="image/svg+xml")


def error_page(request: Request, status: int, detail: str) -> HTMLResponse:
    """A page's HTML 404, or for 401/403 (reads closed, or a token not scoped to this image) a sign-in form;
    API routes under /v1 keep their JSON problem."""
    name, ctx = ("404.html", {}) if status == 404 else ("signin.html", {"next": request.url.path, "live": False})
    return templates.TemplateResponse(request, name, {"detail": detail, "partial": False, **ctx}, status_code=status)


@router.post("/signin")
async def sign_in(request: Request) -> Response:
    """The dashboard's sign-in when reads are closed: the pasted token, checked, is kept in an HttpOnly,
    SameSite=Strict cookie that page loads send (writes still need the Authorization header)."""
    _same_origin(request)
    form = parse_qs((await request.body()).decode("utf-8", errors="replace"))
    nxt, secret = (form.get("next") or ["/"])[0], (form.get("token") or [""])[0].strip()
    await resolve(request, secret)  # 401 (the form again) for an unknown token
    page = RedirectResponse(nxt if nxt.startswith("/") and not nxt.startswith("//") else "/", status_code=303)
    page.set_cookie(COOKIE, secret, httponly=True, samesite="strict", secure=request.app.state.settings.cookie_secure)
    return page


def _same_origin(request: Request) -> None:
    """Login CSRF: another site's form must not sign this browser in with the other site's token. A browser
    names the page a form came from (Origin on every POST; Referer where an old one does not); it must be this
    host. A client that names none (curl, a script) is no browser to trick."""
    for header in ("origin", "referer"):
        value = request.headers.get(header)
        if value is not None:
            if urlsplit(value).netloc.lower() != request.headers.get("host", "").lower():
                raise Forbidden(f"{header}: the sign-in form was posted from {value[:100]!r}, not from this "
                                f"service's pages", header)
            return


@router.get("/tokens", response_class=HTMLResponse)
def tokens_page(request: Request, who: ReadAuth) -> Response:
    """Admin tokens in the browser: the page calls /v1/tokens with an admin token the user pastes in."""
    return _page(request, "tokens.html", {"live": False})


@router.get("/favicon.ico")
def favicon(who: ReadAuth) -> FileResponse:
    """Browsers ask for /favicon.ico before reading the page's <link rel="icon">."""
    return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")


@router.get("/workers", response_class=HTMLResponse)
def workers_page(request: Request, db: DbDep, settings: SettingsDep, who: ReadAuth) -> Response:
    with db.session(write=False) as s:
        ws = [w for w in campaigns.workers(s, settings.stale_worker_s) if who.may_see(w["image_digest"])]
    return _page(request, "workers.html", {"workers": ws, "stale_s": settings.stale_worker_s})
