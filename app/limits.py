"""Refuse oversized request bodies before they are read into memory: 413 naming the body."""

from __future__ import annotations

import json


class BodyLimit:
    def __init__(self, app, max_bytes: int):  # type: ignore[no-untyped-def]
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = next((v for k, v in scope.get("headers") or () if k == b"content-length"), None)
        if declared is not None and declared.isdigit():
            if int(declared) > self.max_bytes:
                return await self._reject(send)
            # the server reads no more than a declared length: only a chunked body needs counting
            return await self.app(scope, receive, send)
        seen = 0

        async def limited():  # type: ignore[no-untyped-def]
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return msg

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._reject(send)

    async def _reject(self, send):  # type: ignore[no-untyped-def]
        body = json.dumps({"title": "payload too large", "status": 413, "field": "body",
                           "detail": f"body: larger than {self.max_bytes} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/problem+json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass
