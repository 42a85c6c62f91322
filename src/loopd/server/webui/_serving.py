"""`webui_router`: ``GET /`` serves ``dist/index.html`` (or a page saying how to build it), ``GET /assets/…`` the
hashed bundle files with a year-long immutable cache, ``GET /favicon.ico`` nothing (204); every answer carries a
strict Content-Security-Policy.

The page is read from disk on each request (a few kilobytes, in a worker thread), so ``make web`` while the server
runs takes effect on reload. Asset paths are resolved inside ``dist/assets`` only: anything else (``..``, absolute
paths, symlinks out of it, folders) is the 404 envelope.
Must not do: mint or check cookies (`SecurityMiddleware` does that on ``/`` before this runs), or name any host
beyond the server itself in a policy or a page.
"""

from __future__ import annotations

import asyncio
import html
import mimetypes
from pathlib import Path
from typing import Annotated, Final

from fastapi import APIRouter, Depends, Request
from starlette.responses import FileResponse, HTMLResponse, Response

from loopd import __version__
from loopd.server.http import COOKIE_NAME, ApiError, Identity, identity_of

DIST_DIR: Final = Path(__file__).resolve().parent / "dist"
"""Where ``vite build`` writes the page (git-ignored; the wheel includes it as a build artifact)."""
ASSETS_PREFIX: Final = "/assets/"
FAVICON_PATH: Final = "/favicon.ico"
CONTENT_SECURITY_POLICY: Final = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
"""Only this server's own URLs: no CDN, no inline script, no framing."""
_COMMON_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
IMMUTABLE: Final = "public, max-age=31536000, immutable"
_NO_IDENTITY: Final = "(none: on another machine, open a link from `loopd signin-link`)"
_READ_TIMEOUT: Final = 10.0
_MAX_PAGE_BYTES: Final = 1_048_576

_MISSING: Final = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>loopd: the web UI is not built</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
</head><body>
<main>
<h1>loopd</h1>
<p>This server is running (version {version}), but its web UI has not been built. In the loopd source tree run:</p>
<pre>make web</pre>
<p>(it runs <code>npm ci</code> and <code>npm run build</code> in <code>web/</code>, which writes
<code>src/loopd/server/webui/dist/</code>; <code>make run</code> does it for you), then reload this page.
Meanwhile use the CLI (it asks the Router; the answer streams back):</p>
<pre>loopd chat "hello"</pre>
<p>or the HTTP API described at <a href="/docs">/docs</a>.</p>
<p>Your browser identity here is <code>{identity}</code> (kept in the <code>{cookie}</code> cookie).</p>
</main>
</body></html>
"""


def webui_router(dist: Path | None = None) -> APIRouter:
    """The page at ``/`` and its assets under ``/assets/``, from ``dist`` (default `DIST_DIR`)."""
    folder = (dist or DIST_DIR).resolve()
    assets = folder / "assets"
    router = APIRouter(include_in_schema=False)

    @router.get("/", response_class=HTMLResponse)
    async def page(caller: Annotated[Identity | None, Depends(_optional_identity)]) -> Response:
        body = await _read_page(folder / "index.html")
        if body is None:
            who = caller.text if caller is not None else _NO_IDENTITY
            text = _MISSING.format(version=html.escape(__version__), identity=html.escape(who), cookie=COOKIE_NAME)
            return HTMLResponse(text, status_code=200, headers={**_COMMON_HEADERS, "Cache-Control": "no-store"})
        return HTMLResponse(body, headers={**_COMMON_HEADERS, "Cache-Control": "no-cache"})

    @router.get(FAVICON_PATH)
    async def favicon() -> Response:
        """No icon (browsers ask for one unprompted): an empty answer instead of a 404 in the console."""
        return Response(status_code=204, headers={**_COMMON_HEADERS, "Cache-Control": "public, max-age=86400"})

    @router.get(ASSETS_PREFIX + "{path:path}")
    async def asset(path: str) -> Response:
        async with asyncio.timeout(_READ_TIMEOUT):
            file = await asyncio.to_thread(_asset_file, assets, path)
        if file is None:
            raise ApiError("not_found", f"no asset {path!r}")
        media_type = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
        if media_type.startswith("text/") or media_type in {"application/javascript", "application/json"}:
            media_type += "; charset=utf-8"
        return FileResponse(file, media_type=media_type, headers={**_COMMON_HEADERS, "Cache-Control": IMMUTABLE})

    return router


async def _optional_identity(request: Request) -> Identity | None:
    return identity_of(request)


async def _read_page(index: Path) -> bytes | None:
    def read() -> bytes | None:
        try:
            with index.open("rb") as file:
                return file.read(_MAX_PAGE_BYTES)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    async with asyncio.timeout(_READ_TIMEOUT):
        return await asyncio.to_thread(read)


def _asset_file(assets: Path, path: str) -> Path | None:
    """The file ``path`` names inside ``assets`` (symlinks resolved), or None when it is not one."""
    if not path or "\x00" in path or path.startswith("/") or "\\" in path:
        return None
    try:
        candidate = (assets / path).resolve()
    except (OSError, RuntimeError):
        return None
    if not candidate.is_relative_to(assets.resolve()) or not candidate.is_file():
        return None
    return candidate
