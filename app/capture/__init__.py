"""The capture agent: follows a vLLM/SGLang server's log beside it and posts AITER's lookup lines to the service.

Light on purpose: it runs inside serving images, so this package imports only the standard library, httpx,
pydantic and the pure rule modules it shares with the service (app.domain.log_lines for the line grammar,
app.schemas for the wire model, app.aiter_install for the installed AITER). tests/unit/test_capture_light.py keeps it that way.
"""
