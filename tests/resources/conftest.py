"""Fixtures for the resource layer: stores on both backends, a live TLS API, and a kubectl bound to it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loopd.resources import (
    ApiCredentials,
    MemoryResourceStore,
    PostgresResourceStore,
    ResourceStore,
    SqliteResourceStore,
    StoreOptions,
    load_or_create_credentials,
    open_api_server,
    open_sqlite_store,
    render_kubeconfig,
)
from tests.support.availability import missing
from tests.support.kubectl import Kubectl, find_kubectl
from tests.support.postgres import postgres_dsn, postgres_server

__all__ = ["postgres_dsn", "postgres_server"]  # fixtures re-exported for pytest

StoreFactory = Callable[..., Awaitable[ResourceStore]]


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def open_store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[StoreFactory]:
    """Open stores on the parametrized backend (several may share one database, except in memory); all closed
    afterwards. ``memory`` is the engine over the inline in-memory database that ``InMemoryClient`` runs on."""
    dsn = str(request.getfixturevalue("postgres_dsn")) if backend == "postgres" else ""
    stores: list[ResourceStore] = []

    async def factory(**overrides: Any) -> ResourceStore:
        options = StoreOptions(**{"poll_interval": 0.2, **overrides})
        store: ResourceStore
        if backend == "memory":
            if stores:
                pytest.skip("an in-memory store shares its database with no other store")
            store = await MemoryResourceStore.open(options=options)
        elif backend == "postgres":
            store = await PostgresResourceStore.open(dsn, options=options)
        else:
            store = await SqliteResourceStore.open(tmp_path / "resources.db", options=options)
        stores.append(store)
        return store

    try:
        yield factory
    finally:
        for store in stores:
            await store.aclose()


@pytest.fixture
async def store(open_store: StoreFactory) -> ResourceStore:
    return await open_store()


@pytest.fixture(scope="session")
def credentials(tmp_path_factory: pytest.TempPathFactory) -> ApiCredentials:
    return load_or_create_credentials(tmp_path_factory.mktemp("api-data"))


@dataclass(frozen=True)
class RunningApi:
    url: str
    store: ResourceStore
    credentials: ApiCredentials
    kubeconfig: Path


@asynccontextmanager
async def open_running_api(tmp_path: Path, credentials: ApiCredentials, **options: Any) -> AsyncIterator[RunningApi]:
    """The resource API over real TLS on 127.0.0.1, backed by a fresh SQLite store."""
    store_options = StoreOptions(**{"poll_interval": 0.2, "bookmark_interval": 0.3, **options})
    folder = tmp_path / f"api-{len(list(tmp_path.glob('api-*')))}"
    folder.mkdir()
    async with (
        open_sqlite_store(folder / "api.db", options=store_options) as store,
        open_api_server(store, credentials=credentials) as server,
    ):
        kubeconfig = folder / "kubeconfig"
        kubeconfig.write_text(render_kubeconfig(server.url, credentials.ca_pem, credentials.token))
        yield RunningApi(server.url, store, credentials, kubeconfig)


@pytest.fixture
async def api(tmp_path: Path, credentials: ApiCredentials) -> AsyncIterator[RunningApi]:
    async with open_running_api(tmp_path, credentials) as running:
        yield running


def require_kubectl() -> str:
    """The kubectl binary; skips (or fails under CI=true) when it is not installed."""
    binary = find_kubectl()
    if binary is None:
        missing("the kubectl binary is not installed")
        raise AssertionError("unreachable: missing() raises")
    return binary


@pytest.fixture
def kubectl(api: RunningApi, tmp_path: Path) -> Kubectl:
    return Kubectl(require_kubectl(), api.kubeconfig, tmp_path / "kube-home")
