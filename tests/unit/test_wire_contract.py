"""One wire format: the service's lease routes and the worker's client speak the same pydantic models
(app/wire.py), which a worker can import without FastAPI or SQLAlchemy."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fastapi.routing import APIRoute

from app import wire
from tests.conftest import DIGEST, ROOT


def test_the_wire_module_needs_neither_fastapi_nor_sqlalchemy():
    code = ("import sys, app.wire, workers.client; "
            "print([m for m in ('fastapi', 'sqlalchemy', 'starlette') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.replace("'", '"')) == []


WIRE_ROUTES = {  # path -> (request body model, response model)
    "/v1/leases": (wire.LeaseIn, wire.LeaseOut),
    "/v1/leases/{lease_id}/heartbeat": (None, wire.HeartbeatOut),
    "/v1/leases/{lease_id}/results": (wire.ResultIn, wire.ResultOut),
    "/v1/leases/{lease_id}/release": (wire.ReleaseIn, wire.ReleaseOut),
}


def api_routes(app) -> list[APIRoute]:  # type: ignore[no-untyped-def]
    """Every APIRoute, through included routers (FastAPI keeps them nested)."""
    out, todo = [], list(app.routes)
    while todo:
        r = todo.pop()
        if isinstance(r, APIRoute):
            out.append(r)
        inner = getattr(r, "original_router", None) or getattr(r, "router", None)
        todo.extend(getattr(inner, "routes", []) if inner is not None and inner is not r else [])
    return out


def test_the_service_routes_declare_exactly_the_wire_models(settings):
    from app.main import create_app
    routes = {r.path: r for r in api_routes(create_app(settings)) if "POST" in r.methods}
    for path, (body, answer) in WIRE_ROUTES.items():
        r = routes[path]
        assert r.response_model is answer, path
        got = r.body_field.field_info.annotation if r.body_field is not None else None
        assert got is body or (body is not None and got == body | None), (path, got)


def test_what_the_worker_sends_is_valid_on_the_wire():
    from workers.agent import Agent, AgentConfig
    from workers.backends.base import ShapeResult
    from workers.client import Refused, ServiceClient
    from workers.identity import WorkerIdentity

    class B:
        name, families = "torch", ["bf16_gemm"]

    client = ServiceClient("http://127.0.0.1:9", retry_for_s=0.5)
    agent = Agent(client, B(), WorkerIdentity("gfx942", 304, "cpu", "h"),
                  AgentConfig("w-1", DIGEST, 60.0, spool_dir=str(ROOT / ".cache" / "spool-contract")))
    wire.LeaseIn.model_validate(agent.lease_request())
    res = ShapeResult(7, "ok", row={"M": 1}, us=3.0, err_ratio=0.0, candidates=[{"name": "c", "us": float("inf")}])
    wire.ResultIn.model_validate(res.payload("torch", None))  # an unfinished candidate's inf becomes null
    with pytest.raises(Refused) as e:  # a NaN winner is refused before it is sent, naming the field
        client.post_result("00000000-0000-0000-0000-000000000000", {**res.payload("torch", None), "us": float("nan")})
    assert e.value.field == "us"


def test_one_result_status_is_the_plain_string_on_the_wire_in_the_spool_and_in_the_log():
    """Issue 36: one ResultStatus from the backends through the wire to the results table. Its values are the
    strings today's wire, spool records and databases hold, and a result carrying a member is the very JSON (and
    log text) a result carrying the plain string was."""
    assert [s.value for s in wire.ResultStatus] == ["ok", "default_best", "failed"]
    plain = {"shape_id": 1, "backend": "torch", "status": "failed", "error": "backend error"}
    typed = {**plain, "status": wire.ResultStatus.FAILED}
    assert wire.ResultIn.model_validate(typed).model_dump_json() == wire.ResultIn.model_validate(plain).model_dump_json()
    assert b'"status":"failed"' in wire.ResultIn.model_validate(typed).model_dump_json().encode()
    assert json.dumps(typed) == json.dumps(plain)  # a spool record
    assert f"{wire.ResultStatus.DEFAULT_BEST}" == "%s" % wire.ResultStatus.DEFAULT_BEST == "default_best"  # logs
    assert wire.ResultStatus.OK == "ok" and wire.ResultIn.model_validate({**plain, "status": "ok"}).status is \
        wire.ResultStatus.OK


ERRORS = {"401", "403", "404", "409", "413", "422", "503"}  # the problems any route may answer


def test_every_route_declares_its_answer_its_body_and_its_errors_as_problems(settings):
    """A response model (or a declared non-JSON answer) on every route; the document declares every request body,
    the capture's three forms included, and every error response as application/problem+json."""
    from app.main import create_app
    app = create_app(settings)
    for r in api_routes(app):
        if r.include_in_schema:
            declared = r.responses.get(200, {}).get("content", {})
            model = r.response_model  # a model, not one inferred from a bare `-> dict`
            assert model not in (None, dict, list) or set(declared) - {"application/json"}, r.path
    doc = app.openapi()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if method in ("post", "put") and not path.endswith(("/heartbeat", "/requeue-failed", "/apply", "/start", "/finish", "/promote")):
                assert op.get("requestBody", {}).get("content"), (method, path)
            for code in ERRORS:
                content = op["responses"].get(code, {}).get("content", {})
                assert content.get("application/problem+json", {}).get("schema") == {
                    "$ref": "#/components/schemas/Problem"}, (method, path, code)
    bodies = doc["paths"]["/v1/captures"]["post"]["requestBody"]["content"]
    assert {"application/json", "text/csv", "text/plain"} <= set(bodies)


def test_results_go_one_by_one_to_a_service_without_the_batch_route(tmp_path):
    """A worker newer than its service: the batch route's 404 (naming no field) makes it post each result alone,
    never treat the results as refused."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from workers.client import LeaseLost, ServiceClient

    seen: list[str] = []

    class OldService(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(self.path)
            if self.path.endswith("/batch"):
                status, answer = 404, {"title": "not found", "status": 404, "detail": "Not Found", "field": None}
            elif body["shape_id"] == 2:
                status, answer = 409, {"status": 409, "detail": "lease expired", "field": "lease_id"}
            else:
                status, answer = 200, {"result_id": 10 + body["shape_id"], "shape_state": "tuned", "verified": True}
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a) -> None:  # type: ignore[no-untyped-def]
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), OldService)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = ServiceClient(f"http://127.0.0.1:{srv.server_address[1]}", retry_for_s=1)
        body = {"backend": "torch", "status": "default_best", "us": 5.0, "default_us": 5.0}
        out = client.post_results("lease-1", [{**body, "shape_id": 1}, {**body, "shape_id": 2}])
        assert isinstance(out[0], wire.ResultOut) and out[0].result_id == 11 and isinstance(out[1], LeaseLost)
        assert seen == ["/v1/leases/lease-1/results/batch", "/v1/leases/lease-1/results", "/v1/leases/lease-1/results"]
    finally:
        srv.shutdown()
