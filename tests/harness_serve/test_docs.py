"""`/docs` works offline: the page references only this server's URLs, and every asset it loads is served here.

Both apps use the one helper (`install_docs`); loop-server serves the page and its assets without credentials."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from loopd._infra.clock import VirtualClock
from loopd._infra.docs import DOCS_ASSETS_PATH
from loopd.harness import SqliteJournal
from loopd.server.storage import Database, DatabaseOptions
from tests.server_http.support import build_rig

from .conftest import scripted_rig, serving

_REFERENCES = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|\burl\s*:\s*["']([^"']+)["']""")


def _references(page: str) -> list[str]:
    return [a or b for a, b in _REFERENCES.findall(page)]


async def _check_docs(client: httpx.AsyncClient) -> None:
    page = await client.get("/docs")
    assert page.status_code == 200, page.text
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    assert "SwaggerUIBundle" in html
    assert not re.search(r"(?i)\b(?:https?:)?//", html), "the page names a URL outside this server"
    references = _references(html)
    assert {urlsplit(ref).path for ref in references} >= {
        f"{DOCS_ASSETS_PATH}/swagger-ui-bundle.js",
        f"{DOCS_ASSETS_PATH}/swagger-ui.css",
        f"{DOCS_ASSETS_PATH}/favicon.png",
        "/openapi.json",
    }
    for ref in references:
        assert ref.startswith("/") and not ref.startswith("//"), ref
        asset = await client.get(ref)
        assert asset.status_code == 200, ref
        assert asset.content, ref
    script = await client.get(f"{DOCS_ASSETS_PATH}/swagger-ui-bundle.js")
    assert "javascript" in script.headers["content-type"]
    assert len(script.content) > 100_000  # the real bundle, not a stub
    missing = await client.get(f"{DOCS_ASSETS_PATH}/../pyproject.toml")
    assert missing.status_code in (401, 404)  # not served (401 where only /static/docs/ is public)


async def test_harness_serve_docs_work_offline(journal: SqliteJournal) -> None:
    async with serving(scripted_rig(journal, [])) as served:
        await _check_docs(served.client)


async def test_harness_serve_docs_need_no_token_but_the_api_does(journal: SqliteJournal) -> None:
    async with (
        serving(scripted_rig(journal, []), token="s3cret") as served,
        httpx.AsyncClient(base_url=served.url, timeout=15.0) as anonymous,
    ):
        await _check_docs(anonymous)
        refused = await anonymous.get("/v1/sessions")
        assert refused.status_code == 401


@pytest.fixture
async def server_db(tmp_path: Path) -> AsyncIterator[Database]:
    db = await Database.open(tmp_path / "loopd.db", options=DatabaseOptions(clock=VirtualClock()))
    try:
        yield db
    finally:
        await db.aclose()


async def test_loop_server_docs_work_offline_and_need_no_credentials(server_db: Database) -> None:
    clock = server_db.clock
    assert isinstance(clock, VirtualClock)
    rig = build_rig(server_db, clock)
    try:
        await _check_docs(rig.client(token=False))
    finally:
        await rig.aclose()
