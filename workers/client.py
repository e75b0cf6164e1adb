"""HTTP client for the service. Retries a busy (503) or unreachable service, honouring Retry-After."""

from __future__ import annotations

import time
from typing import Any

import httpx


class LeaseLost(Exception):
    """The service no longer holds this lease for us (expired or released)."""


class ServiceError(Exception):
    pass


class ServiceClient:
    def __init__(self, base_url: str, timeout_s: float = 30.0, retry_for_s: float = 60.0,
                 token: str | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s, headers=headers)
        self.retry_for_s = retry_for_s
        self.retries = 0  # 503s and connection errors ridden out

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        give_up = time.monotonic() + self.retry_for_s
        delay = 0.2
        while True:
            try:
                r = self.http.request(method, path, **kw)
            except (httpx.ConnectError, httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.WriteError):
                if time.monotonic() > give_up:
                    raise
                self.retries += 1
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if r.status_code == 503 and time.monotonic() < give_up:
                self.retries += 1
                time.sleep(float(r.headers.get("Retry-After", delay)))
                continue
            return r

    def _json(self, r: httpx.Response) -> Any:
        if r.status_code == 409:
            raise LeaseLost(r.json().get("detail", r.text))
        if r.status_code >= 400:
            raise ServiceError(f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text[:500]}")
        return r.json()

    def lease(self, body: dict) -> dict | None:
        r = self._call("POST", "/v1/leases", json=body)
        return None if r.status_code == 204 else self._json(r)

    def heartbeat(self, lease_id: str) -> dict:
        return self._json(self._call("POST", f"/v1/leases/{lease_id}/heartbeat"))

    def post_result(self, lease_id: str, body: dict) -> dict:
        return self._json(self._call("POST", f"/v1/leases/{lease_id}/results", json=body))

    def release(self, lease_id: str) -> dict:
        return self._json(self._call("POST", f"/v1/leases/{lease_id}/release"))

    def put_tables(self, digest: str, body: dict) -> dict:
        return self._json(self._call("PUT", f"/v1/images/{digest}/tables", json=body))
