from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from loopd.resources import (
    StoreOptions,
    load_or_create_credentials,
    open_api_server,
    open_sqlite_store,
    render_kubeconfig,
)
from loopd.resources.client import InMemoryClient, ResourceClient, StoreClient, open_http_client
from loopd.resources.reconcile import VirtualClock

# Small enough that a test can outrun the retained history (→ 410 Gone) with a few dozen writes.
HISTORY = 40
BOOKMARK_INTERVAL = 0.2


def missing(what: str) -> None:
    """Real components are required in CI; elsewhere a missing one skips."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} is required in CI")
    pytest.skip(f"{what} is not available")


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def memory(clock: VirtualClock) -> InMemoryClient:
    return InMemoryClient(clock=clock)


@dataclass
class Target:
    """One ``ResourceClient`` implementation under the shared contract."""

    name: str
    client: ResourceClient
    request_bookmark: Callable[[], None]
    """Make a BOOKMARK due on open watches (the twin sends at once; the store does on a short interval)."""


def _store_options() -> StoreOptions:
    return StoreOptions(event_window=HISTORY, bookmark_interval=BOOKMARK_INTERVAL, poll_interval=0.2)


def _nothing() -> None:
    return None


def require_kubernetes_client() -> None:
    """The HTTP client needs the optional ``k8s`` extra (kubernetes_asyncio)."""
    try:
        import kubernetes_asyncio  # noqa: F401
    except ImportError:
        missing("the k8s extra (kubernetes_asyncio)")


@asynccontextmanager
async def serve_api(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    """The embedded API over TLS on 127.0.0.1 (a fresh SQLite store), and a parsed kubeconfig to reach it."""
    require_kubernetes_client()
    credentials = load_or_create_credentials(tmp_path / "data")
    async with (
        open_sqlite_store(tmp_path / "resources.db", options=_store_options()) as store,
        open_api_server(store, credentials=credentials) as server,
    ):
        kubeconfig: dict[str, Any] = yaml.safe_load(
            render_kubeconfig(server.url, credentials.ca_pem, credentials.token)
        )
        yield kubeconfig


@pytest.fixture(params=["memory", "store", "http"])
async def target(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Target]:
    if request.param == "memory":
        twin = InMemoryClient(history_limit=HISTORY)
        yield Target("memory", twin, twin.send_bookmarks)
        await twin.aclose()
    elif request.param == "store":
        async with open_sqlite_store(tmp_path / "resources.db", options=_store_options()) as store:
            yield Target("store", StoreClient(store), _nothing)
    else:
        async with serve_api(tmp_path) as kubeconfig, open_http_client(kubeconfig, request_timeout=10.0) as client:
            yield Target("http", client, _nothing)
