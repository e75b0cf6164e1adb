"""/docs and /redoc load every asset from the app itself (a package's files), so they work offline."""

from __future__ import annotations

import re

import pytest


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_api_docs_pages_load_nothing_from_another_host(client, page):
    html = client.get(page).text
    assets = re.findall(r"""(?:src|href)\s*[=:]\s*['"]([^'"]+)['"]""", html)
    scripts = [a for a in assets if a.endswith(".js")]
    assert scripts, html  # the page's UI really is a script we serve
    for url in assets:
        assert url.startswith("/") and not url.startswith("//"), f"{page} loads {url} from elsewhere"
        r = client.get(url)
        assert r.status_code == 200 and len(r.content) > 100, url
        assert url not in scripts or "cdn.redoc.ly" not in r.text, f"{url} draws ReDoc's badge from its CDN"
    assert "fonts.googleapis" not in html and "cdn." not in html


def test_the_openapi_declares_the_bearer_token_so_docs_can_authorize(client):
    doc = client.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": doc["components"]["securitySchemes"]["bearer"]["description"]}
    assert {"bearer": []} in doc["security"] and {} in doc["security"]  # optional: reads may be open


def test_the_favicon_is_served(client):
    r = client.get("/favicon.ico")
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg")
    assert 'rel="icon"' in client.get("/").text
