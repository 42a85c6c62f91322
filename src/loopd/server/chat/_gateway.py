"""The Task resource seen from the chat flow: create it inside the message transaction, bump it, delete it.

`TaskGateway` is the one-method-per-verb seam; `ResourceTaskGateway` implements it over any
``loopd.resources.client.ResourceClient`` (the embedded store in-process, the in-memory twin in tests, a real
cluster through the HTTP client). A Task is ``default/<task_id>`` with ``spec.target{kind, key}`` and
``spec.revision`` — nothing else (DESIGN §9.3).

Errors: every failure to reach or change the Task becomes `TaskUnavailable` (a retryable storage-style error,
503 over HTTP); an absent Task is never an error for ``delete`` and ``bump_revision`` (the server never recreates
a deleted Task).
Must not do: touch the database.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final, Protocol

from loopd._infra.telemetry import trace_annotations
from loopd.resources import Conflict as ResourceConflict
from loopd.resources import NotFound as ResourceNotFound
from loopd.resources.client import TASKS, ResourceClient, task_target_labels
from loopd.server.storage import StorageUnavailable

DEFAULT_NAMESPACE: Final = "default"
_BUMP_ATTEMPTS: Final = 5


class TaskUnavailable(StorageUnavailable):
    """The Task resource could not be created, read, changed or deleted (retryable; 503)."""


class TaskGateway(Protocol):
    async def create(self, task_id: str, target_kind: str, target_key: str) -> str:
        """Create the Task (revision 1); returns its uid."""
        ...

    async def get(self, task_id: str) -> dict[str, Any] | None:
        """The Task object, or None when it does not exist."""
        ...

    async def delete(self, task_id: str) -> None:
        """Delete the Task; an absent Task is fine."""
        ...

    async def bump_revision(self, task_id: str) -> None:
        """``spec.revision += 1`` to re-wake the responder; an absent Task is left absent."""
        ...


class ResourceTaskGateway:
    """`TaskGateway` over a ``ResourceClient``; every call is bounded by ``timeout`` seconds."""

    def __init__(self, client: ResourceClient, *, namespace: str = DEFAULT_NAMESPACE, timeout: float = 10.0) -> None:
        if not (timeout > 0):
            raise ValueError("timeout must be positive")
        self._client = client
        self._namespace = namespace
        self._timeout = timeout

    async def create(self, task_id: str, target_kind: str, target_key: str) -> str:
        metadata: dict[str, Any] = {
            "name": task_id,
            "namespace": self._namespace,
            "labels": task_target_labels(target_kind, target_key),  # watchers select their own Tasks by them
        }
        annotations = trace_annotations()  # the question's trace context, for whoever answers (tracing on only)
        if annotations:
            metadata["annotations"] = annotations
        body = {
            "apiVersion": TASKS.api_version,
            "kind": TASKS.kind,
            "metadata": metadata,
            "spec": {"target": {"kind": target_kind, "key": target_key}, "revision": 1},
        }
        try:
            async with asyncio.timeout(self._timeout):
                created = await self._client.create(TASKS, body, namespace=self._namespace)
        except Exception as exc:
            raise TaskUnavailable(f"cannot create Task {task_id}: {_describe(exc)}") from exc
        return str(created.get("metadata", {}).get("uid") or "")

    async def get(self, task_id: str) -> dict[str, Any] | None:
        try:
            async with asyncio.timeout(self._timeout):
                return await self._client.get(TASKS, task_id, namespace=self._namespace)
        except ResourceNotFound:
            return None
        except Exception as exc:
            raise TaskUnavailable(f"cannot read Task {task_id}: {_describe(exc)}") from exc

    async def delete(self, task_id: str) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await self._client.delete(TASKS, task_id, namespace=self._namespace)
        except ResourceNotFound:
            return
        except Exception as exc:
            raise TaskUnavailable(f"cannot delete Task {task_id}: {_describe(exc)}") from exc

    async def bump_revision(self, task_id: str) -> None:
        for _ in range(_BUMP_ATTEMPTS):
            current = await self.get(task_id)
            if current is None or current.get("metadata", {}).get("deletionTimestamp"):
                return
            revision = current.get("spec", {}).get("revision", 1)
            revision = revision if isinstance(revision, int) and not isinstance(revision, bool) else 1
            patch = {
                "metadata": {"resourceVersion": current.get("metadata", {}).get("resourceVersion")},
                "spec": {"revision": revision + 1},
            }
            try:
                async with asyncio.timeout(self._timeout):
                    await self._client.patch(TASKS, task_id, patch, namespace=self._namespace)
                return
            except ResourceConflict:
                continue  # someone else changed it in between: re-read and bump again
            except ResourceNotFound:
                return
            except Exception as exc:
                raise TaskUnavailable(f"cannot wake Task {task_id}: {_describe(exc)}") from exc
        raise TaskUnavailable(f"cannot wake Task {task_id}: it kept changing under {_BUMP_ATTEMPTS} attempts")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "the resource API did not answer in time"
    return f"{type(exc).__name__}: {exc}"
