"""Serve the resource API on its own TLS endpoint (standalone, and for tests), and render kubeconfigs.

Owns: ``open_api_server`` (uvicorn on a socket with the data-dir certificate, started and stopped inside the
caller's event loop; loopback only unless the caller passes ``public=True``) and ``render_kubeconfig``.
Must not do: decide the data dir or any CLI behaviour.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn
import yaml

from ._api import create_api_app
from ._api_access import TokenResolver
from ._credentials import ApiCredentials
from ._store import ResourceStore

_START_TIMEOUT = 10.0
_STOP_TIMEOUT = 5.0


@dataclass(frozen=True)
class ApiServer:
    url: str
    host: str
    port: int


def _format_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def is_loopback_address(host: str) -> bool:
    """Whether ``host`` (``localhost`` or an IP address) is this machine's loopback."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


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
) -> AsyncIterator[ApiServer]:
    """Serve ``store`` over HTTPS with bearer-token auth until the block exits (``port=0`` picks a free port).

    A ``host`` beyond loopback is refused (``ValueError``) unless ``public``: the caller's explicit opt-in.
    ``resolve_token`` maps a token other than the admin's to the responder it belongs to (see ``_api_access``).
    """
    if not public and not is_loopback_address(host):
        raise ValueError(f"the resource API listens on loopback only unless public=True, not on {host!r}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that say so, and without it each response
    # body on a kept-alive connection waits ~40 ms for the ACK of its headers (Nagle + delayed ACK).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    bound_port = int(sock.getsockname()[1])
    config = uvicorn.Config(
        create_api_app(store, token=credentials.token, resolve_token=resolve_token),
        ssl_certfile=str(credentials.server_cert_file),
        ssl_keyfile=str(credentials.server_key_file),
        log_level="warning",
        lifespan="off",
        access_log=False,
        timeout_graceful_shutdown=max(1, int(graceful_shutdown)),
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="loopd-resources-api-server")
    try:
        async with asyncio.timeout(_START_TIMEOUT):
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("the resource API server stopped during startup")
                await asyncio.sleep(0.01)
        yield ApiServer(url=f"https://{_format_host(host)}:{bound_port}", host=host, port=bound_port)
    finally:
        server.should_exit = True
        try:
            async with asyncio.timeout(_STOP_TIMEOUT + graceful_shutdown):
                await task  # a timeout cancels the server task
        except TimeoutError:
            server.force_exit = True
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            sock.close()


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
