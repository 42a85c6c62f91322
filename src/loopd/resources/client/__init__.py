"""Kubernetes API clients for controllers: one small protocol, three implementations.

Owns: the ``ResourceClient`` protocol and its implementations — the HTTP client over ``kubernetes_asyncio``
(real clusters and the embedded API, configured by kubeconfig), the in-process client over a
``loopd.resources`` store (the all-in-one mode), and the in-memory twin for tests.
Must not do: reconcile, retry or cache (see ``loopd.resources.reconcile``); import ``kubernetes_asyncio``
unless ``open_http_client`` is called.

Errors are the resource layer's tree (``loopd.resources.ResourceError`` and its members), plus
``TransportError``, ``TooManyRequests`` and ``ServerError`` for what only a remote client sees.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from ._errors import ServerError, TooManyRequests, TransportError, error_from_response
from ._memory import InMemoryClient
from ._protocol import ResourceClient
from ._store import StoreClient
from ._types import (
    LEASES,
    TASK_TARGET_KEY_LABEL,
    TASK_TARGET_KIND_LABEL,
    TASKS,
    JsonObject,
    PatchType,
    ResourceType,
    name_of,
    namespace_of,
    resource_version_of,
    task_target_labels,
    tasks_not_for,
)

if TYPE_CHECKING:
    from ._http import HttpResourceClient


def open_http_client(
    kubeconfig: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    *,
    context: str | None = None,
    request_timeout: float = 30.0,
) -> AbstractAsyncContextManager[HttpResourceClient]:
    """Open an HTTP client configured like ``kubectl`` (kubernetes-asyncio, a base dependency).

    ``kubeconfig`` is a path or a parsed kubeconfig; without it ``$KUBECONFIG``, ``~/.kube/config``, or the
    in-cluster service account. ``async with open_http_client() as client: ...``
    """
    from ._http import open_http_client as _open

    return _open(kubeconfig, context=context, request_timeout=request_timeout)


def __getattr__(name: str) -> Any:
    # ``HttpResourceClient`` needs the optional ``k8s`` extra: import it only when asked for.
    if name == "HttpResourceClient":
        from ._http import HttpResourceClient

        return HttpResourceClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "LEASES",
    "TASKS",
    "TASK_TARGET_KEY_LABEL",
    "TASK_TARGET_KIND_LABEL",
    "HttpResourceClient",
    "InMemoryClient",
    "JsonObject",
    "PatchType",
    "ResourceClient",
    "ResourceType",
    "ServerError",
    "StoreClient",
    "TooManyRequests",
    "TransportError",
    "error_from_response",
    "name_of",
    "namespace_of",
    "open_http_client",
    "resource_version_of",
    "task_target_labels",
    "tasks_not_for",
]
