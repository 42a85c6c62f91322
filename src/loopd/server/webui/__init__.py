"""The web UI's serving: the built page (``dist/``, made by ``make web`` from ``web/``) at ``/`` and its assets.

Public face: `webui_router` (``GET /`` and ``GET /assets/{path}``), `DIST_DIR` (where the build lands inside the
package, so a wheel carries it), `CONTENT_SECURITY_POLICY` and `ASSETS_PREFIX`.
Must not do: authenticate (the security middleware mints the browser cookie on ``GET /`` and decides identities),
build the page (Node and Vite do, through ``make web``), or serve anything outside ``dist/``.
"""

from loopd.server.webui._serving import ASSETS_PREFIX, CONTENT_SECURITY_POLICY, DIST_DIR, webui_router

__all__ = ["ASSETS_PREFIX", "CONTENT_SECURITY_POLICY", "DIST_DIR", "webui_router"]
