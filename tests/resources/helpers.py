"""Small builders and waits shared by the resource tests."""

from __future__ import annotations

import asyncio
from typing import Any

from loopd.resources import WatchEvent, WatchStream


def task(
    name: str,
    *,
    key: str = "router",
    kind: str = "operator",
    revision: int | None = None,
    labels: dict[str, str] | None = None,
    namespace: str | None = None,
    **metadata: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, **metadata}
    if labels is not None:
        meta["labels"] = labels
    if namespace is not None:
        meta["namespace"] = namespace
    spec: dict[str, Any] = {"target": {"kind": kind, "key": key}}
    if revision is not None:
        spec["revision"] = revision
    return {"apiVersion": "loopd.dev/v1alpha1", "kind": "Task", "metadata": meta, "spec": spec}


def lease(name: str, *, holder: str = "a", **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, **metadata},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    }


def owner_ref(owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
    }


async def next_event(stream: WatchStream, timeout: float = 5.0) -> WatchEvent:
    async with asyncio.timeout(timeout):
        return await anext(aiter(stream))


async def events(stream: WatchStream, count: int, timeout: float = 5.0) -> list[WatchEvent]:
    return [await next_event(stream, timeout) for _ in range(count)]


async def no_event(stream: WatchStream, within: float = 0.3) -> None:
    try:
        event = await next_event(stream, within)
    except TimeoutError:
        return
    raise AssertionError(f"unexpected watch event {event.type} {event.object.get('metadata')}")


def rv(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])
