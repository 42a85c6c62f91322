"""An API's interactive documentation (Swagger UI), served entirely by the app itself: no CDN, works offline.

`install_docs(app)` adds ``GET /docs`` (an HTML page that loads only this server's URLs) and mounts the Swagger UI
assets under ``/static/docs/`` from the ``fastapi-offline`` package, which bundles them. loop-server and
``loopd harness serve`` call it. Must not do: decide who may read the page (each app's middleware does: the assets
live under ``/static/`` so loop-server serves them without credentials, like its other static files).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Final

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

__all__ = ["DOCS_ASSETS_PATH", "DOCS_PATH", "docs_assets_dir", "install_docs"]

DOCS_PATH: Final = "/docs"
DOCS_ASSETS_PATH: Final = "/static/docs"
_ASSETS: Final = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon.png")


def docs_assets_dir() -> Path:
    """The folder of the bundled Swagger UI assets (inside the installed ``fastapi-offline`` package)."""
    folder = Path(str(files("fastapi_offline") / "static"))
    missing = [name for name in _ASSETS if not (folder / name).is_file()]
    if missing:
        raise RuntimeError(f"the fastapi-offline package lacks {', '.join(missing)} (reinstall loopd's dependencies)")
    return folder


def install_docs(app: FastAPI, *, path: str = DOCS_PATH, assets_path: str = DOCS_ASSETS_PATH) -> None:
    """Serve Swagger UI for ``app``'s OpenAPI document at ``path``, its assets under ``assets_path``.

    Create the app with ``docs_url=None`` (FastAPI's own page loads its assets from a CDN).
    """
    if app.openapi_url is None:
        raise ValueError("the app has no OpenAPI document to show")
    openapi_url = app.openapi_url
    app.mount(assets_path, StaticFiles(directory=docs_assets_dir()), name="docs-assets")

    @app.get(path, include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        root = str(request.scope.get("root_path", ""))
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} — API",
            swagger_js_url=f"{root}{assets_path}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{assets_path}/swagger-ui.css",
            swagger_favicon_url=f"{root}{assets_path}/favicon.png",
            swagger_ui_parameters={"validatorUrl": None},  # the online validator would call out
        )
