"""POST /v1/captures: JSON (shapes, untuned_csv or log inside), or a raw text/csv or text/plain body."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from pydantic import ValidationError

from app.api.deps import DbDep, SettingsDep
from app.schemas import CaptureIn, CaptureOut
from app.auth import CaptureAuth
from app.errors import Invalid, field_of
from app.services import captures

router = APIRouter(tags=["captures"])


def _body_model(ctype: str, raw: bytes, params: dict[str, str]) -> CaptureIn:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Invalid("body: not UTF-8 text", "body") from None
    if ctype.startswith("application/json"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise Invalid(f"body: invalid JSON ({e.msg} at line {e.lineno})", "body") from None
        except RecursionError:
            raise Invalid("body: JSON nested too deeply", "body") from None
        if not isinstance(data, dict):
            raise Invalid("body: expected a JSON object", "body")
    elif ctype.startswith("text/csv"):
        data = dict(params, untuned_csv=text)
    elif ctype.startswith("text/plain"):
        data = dict(params, log=text)
    else:
        raise Invalid(f"content-type: expected application/json, text/csv or text/plain, got {ctype!r}",
                      "content-type")
    try:
        return CaptureIn.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field = field_of(err["loc"]) or "body"
        raise Invalid(f"{field}: {err['msg']}", field) from None


_QUERY = [{"name": n, "in": "query", "required": False, "schema": sch, "description": "with a text/csv or text/plain body"}
          for n, sch in (("image_digest", {"type": "string"}), ("gfx", {"type": "string"}),
                         ("cu_num", {"type": "integer"}), ("family", {"type": "string"}), ("host", {"type": "string"}))]
_BODY = {"parameters": _QUERY, "requestBody": {"required": True, "content": {
    "application/json": {"schema": CaptureIn.model_json_schema()},
    "text/csv": {"schema": {"type": "string", "description": "an AITER untuned CSV (header line first)"}},
    "text/plain": {"schema": {"type": "string", "description": "server log text with AITER lookup lines"}}}}}


@router.post("/v1/captures", status_code=201, response_model=CaptureOut, openapi_extra=_BODY)
async def post_capture(request: Request, db: DbDep, settings: SettingsDep, who: CaptureAuth) -> CaptureOut:
    raw = await request.body()

    def work() -> CaptureOut:  # parsing (up to MBs of log) and the database: off the event loop
        body = _body_model(request.headers.get("content-type", ""), raw, dict(request.query_params))
        who.check_digest(body.image_digest)
        with db.session() as s:
            out = captures.ingest(s, body, settings.max_capture_shapes, settings.max_campaign_shapes, who.may_see)
        request.app.state.metrics.captures.labels(out.family, _format(body)).inc()
        return out

    return await run_in_threadpool(work)


def _format(body: CaptureIn) -> str:
    return "json" if body.shapes is not None else ("untuned_csv" if body.untuned_csv is not None else "log")
