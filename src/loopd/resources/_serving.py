"""Serve the resource API on its own TLS endpoint (standalone, and for tests), and render kubeconfigs.

Owns: ``open_api_server`` (the floor's uvicorn runner with the data-dir certificate, started and stopped inside the
caller's event loop; loopback only unless the caller passes ``public=True``) and ``render_kubeconfig``.
Must not do: decide the data dir or any CLI behaviour.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import yaml

from loopd._infra.clock import Clock
from loopd._infra.http import is_loopback
from loopd._infra.serving import RunningServer, open_http_server

from ._api import create_api_app
from ._api_access import TokenResolver
from ._credentials import ApiCredentials
from ._store import ResourceStore

ApiServer = RunningServer
"""What `open_api_server` yields: ``url`` (``https://…``), ``host``, ``port``."""


@asynccontextmanager
async def open_api_server(
    store: ResourceStore,
    *,
    credentials: ApiCredentials,
    host: str = "127.0.0.1",
    port: int = 0,
    graceful_shutdown: float = 1.0,
    public: bool = False,
    resolve_token: TokenResolver | None = None,
    clock: Clock | None = None,
) -> AsyncIterator[ApiServer]:
    """Serve ``store`` over HTTPS with bearer-token auth until the block exits (``port=0`` picks a free port).

    A ``host`` beyond loopback is refused (``ValueError``) unless ``public``: the caller's explicit opt-in.
    ``resolve_token`` maps a token other than the admin's to the responder it belongs to (see ``_api_access``).
    """
    if not public and not is_loopback(host):
        raise ValueError(f"the resource API listens on loopback only unless public=True, not on {host!r}")
    app = create_api_app(store, token=credentials.token, resolve_token=resolve_token, clock=clock)
    async with open_http_server(
        app,
        host=host,
        port=port,
        graceful_timeout=graceful_shutdown,
        lifespan="off",
        tls_cert=credentials.server_cert_file,
        tls_key=credentials.server_key_file,
    ) as server:
        yield server


def render_kubeconfig(
    server_url: str,
    ca_pem: bytes,
    token: str,
    *,
    name: str = "loopd",
    namespace: str = "default",
) -> str:
    """A kubeconfig (YAML) for ``server_url`` trusting ``ca_pem`` and sending ``token``."""
    document: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": server_url,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        "current-context": name,
        "preferences": {},
    }
    return yaml.safe_dump(document, sort_keys=False)
