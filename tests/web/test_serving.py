"""`/` serves the built page (or says how to build it), `/assets/…` the bundle: strict CSP, immutable caching,
the browser cookie minted as before, nothing outside ``dist/assets`` reachable."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from loopd.server.app import create_server_app
from loopd.server.http import human_key
from loopd.server.webui import CONTENT_SECURITY_POLICY, DIST_DIR
from tests.docs._doctest import loopd_in_prose
from tests.server_http.support import Rig, error_of

REMOTE_PEER = ("192.0.2.9", 50000)
INDEX = '<!doctype html><html lang="en"><head><script type="module" src="/assets/index-abc123.js"></script></head>'


def app_over(rig: Rig, dist: Path) -> FastAPI:
    return create_server_app(rig.ctx, sweepers=False, webui=dist)


def browser(rig: Rig, app: FastAPI, *, remote: bool = False) -> httpx.AsyncClient:
    peer = {"client": REMOTE_PEER} if remote else {}
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False, **peer)  # type: ignore[arg-type]
    return rig.client(token=False, transport=transport)


@pytest.fixture
def dist(tmp_path: Path) -> Path:
    folder = tmp_path / "dist"
    (folder / "assets" / "sub").mkdir(parents=True)
    (folder / "index.html").write_text(INDEX)
    (folder / "assets" / "index-abc123.js").write_text("console.log('loopd')\n")
    (folder / "assets" / "index-abc123.css").write_text("body{margin:0}\n")
    (tmp_path / "secret.txt").write_text("not an asset")
    (folder / "assets" / "escape.js").symlink_to(tmp_path / "secret.txt")
    return folder


def assert_strict_policy(response: httpx.Response) -> None:
    policy = response.headers["content-security-policy"]
    assert policy == CONTENT_SECURITY_POLICY
    directives = dict(part.strip().split(" ", 1) for part in policy.split(";"))
    assert directives["default-src"] == "'self'" and directives["script-src"] == "'self'"
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert not re.search(r"https?:|//|\*", policy), policy  # no other host, no wildcard
    assert response.headers["x-content-type-options"] == "nosniff"


async def test_the_built_page_is_served_at_root_with_the_cookie(rig: Rig, dist: Path) -> None:
    client = browser(rig, app_over(rig, dist))
    page = await client.get("/")
    assert page.status_code == 200 and page.text == INDEX
    assert page.headers["content-type"].startswith("text/html")
    assert page.headers["cache-control"] == "no-cache"
    assert_strict_policy(page)
    cookie = re.match(r"loopd-human=([0-9a-f]{64}); ", page.headers["set-cookie"])
    assert cookie is not None
    me = await client.get("/v1/me")
    assert me.json()["key"] == human_key(cookie.group(1))


async def test_assets_are_public_and_cached_for_good(rig: Rig, dist: Path) -> None:
    client = browser(rig, app_over(rig, dist))
    script = await client.get("/assets/index-abc123.js")
    assert script.status_code == 200 and script.text == "console.log('loopd')\n"
    assert script.headers["content-type"].split(";")[0] in {"text/javascript", "application/javascript"}
    assert script.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert "set-cookie" not in script.headers
    assert_strict_policy(script)
    style = await client.get("/assets/index-abc123.css")
    assert style.headers["content-type"].startswith("text/css")
    # From another machine too: the bundle holds no secret, and the page needs it before signing in.
    remote = browser(rig, app_over(rig, dist), remote=True)
    assert (await remote.get("/assets/index-abc123.js")).status_code == 200
    page = await remote.get("/")
    assert page.status_code == 200 and "set-cookie" not in page.headers
    icon = await remote.get("/favicon.ico")  # browsers ask unprompted: nothing, not a 404 or a 401
    assert icon.status_code == 204 and icon.content == b"" and "set-cookie" not in icon.headers


@pytest.mark.parametrize(
    "path",
    [
        "/assets/",
        "/assets/sub",
        "/assets/missing.js",
        "/assets/escape.js",  # a symlink out of assets/
        "/assets/%2e%2e/index.html",
        "/assets/..%2f..%2fsecret.txt",
        "/assets/sub/%2e%2e/%2e%2e/%2e%2e/secret.txt",
        "/assets/%5c..%5csecret.txt",
    ],
)
async def test_nothing_outside_the_assets_folder_is_served(rig: Rig, dist: Path, path: str) -> None:
    response = await browser(rig, app_over(rig, dist)).get(path)
    assert response.status_code == 404, response.text
    assert error_of(response) == "not_found"
    assert "not an asset" not in response.text


async def test_without_a_build_root_says_how_to_make_it(rig: Rig, tmp_path: Path) -> None:
    client = browser(rig, app_over(rig, tmp_path / "nothing-here"))
    page = await client.get("/")
    assert page.status_code == 200 and "make web" in page.text and "/docs" in page.text
    assert_strict_policy(page)
    cookie = re.match(r"loopd-human=([0-9a-f]{64}); ", page.headers["set-cookie"])
    assert cookie is not None
    assert human_key(cookie.group(1)) in page.text  # whom this browser is, as the placeholder said
    assert ["chat", "hello"] in loopd_in_prose(page.text)  # a command that works meanwhile (tests/docs runs it)
    assert (await client.get("/assets/index.js")).status_code == 404
    remote = await browser(rig, app_over(rig, tmp_path / "nothing-here"), remote=True).get("/")
    assert "set-cookie" not in remote.headers and "signin-link" in remote.text


def test_the_default_page_folder_is_inside_the_package_and_the_wheel() -> None:
    assert DIST_DIR.parent.name == "webui" and DIST_DIR.name == "dist"
    assert (DIST_DIR.parent / "__init__.py").is_file()
    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())
    wheel = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    relative = DIST_DIR.relative_to(root).as_posix()
    assert f"{relative}/**" in wheel["artifacts"]  # git-ignored, yet in the wheel
    assert any(relative.startswith(package + "/") for package in wheel["packages"])
