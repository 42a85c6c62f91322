"""The web UI's serving: the built page (``dist/``, made by ``make web`` from ``web/``) at ``/`` and its assets.

Public face: `webui_router` (``GET /``, ``GET /assets/{path}``, ``GET /favicon.ico``), `DIST_DIR` (where the build
lands inside the package, so a wheel carries it), `CONTENT_SECURITY_POLICY`, `ASSETS_PREFIX` and `FAVICON_PATH`.
Must not do: authenticate (the security middleware mints the browser cookie on ``GET /`` and decides identities),
build the page (Node and Vite do, through ``make web``), or serve anything outside ``dist/``.
"""

from loopd.server.webui._serving import ASSETS_PREFIX, CONTENT_SECURITY_POLICY, DIST_DIR, FAVICON_PATH, webui_router

__all__ = ["ASSETS_PREFIX", "CONTENT_SECURITY_POLICY", "DIST_DIR", "FAVICON_PATH", "webui_router"]
