"""One contract, three clients: the in-memory twin, the in-process store client, and the HTTP client
(kubernetes_asyncio) talking to the embedded API over TLS on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from loopd.resources import AlreadyExists, Conflict, Gone, NotFound, WatchEvent
from loopd.resources.client import LEASES, TASKS, ResourceClient
from tests.support.waiting import eventually

from .conftest import HISTORY, Target
from .helpers import task


async def take(events: AsyncIterator[WatchEvent], count: int, *, timeout: float = 10.0) -> list[WatchEvent]:
    """The next ``count`` events that are not bookmarks."""
    taken: list[WatchEvent] = []
    async with asyncio.timeout(timeout):
        async for event in events:
            if event.type != "BOOKMARK":
                taken.append(event)
                if len(taken) == count:
                    break
    return taken


def summary(events: list[WatchEvent]) -> list[tuple[str, str]]:
    return [(event.type, event.object["metadata"]["name"]) for event in events]


# -- reads and writes ------------------------------------------------------------------------------------------


async def test_create_assigns_identity_version_and_generation(target: Target) -> None:
    created = await target.client.create(TASKS, task("t1"))
    meta = created["metadata"]
    assert (created["apiVersion"], created["kind"]) == ("loopd.dev/v1alpha1", "Task")
    assert meta["name"] == "t1" and meta["namespace"] == "default"
    assert meta["uid"] and meta["resourceVersion"] and meta["creationTimestamp"]
    assert meta["generation"] == 1
    assert await target.client.get(TASKS, "t1", namespace="default") == created


async def test_create_ignores_status_when_the_kind_has_a_status_subresource(target: Target) -> None:
    body = task("t1")
    body["status"] = {"phase": "Succeeded"}
    created = await target.client.create(TASKS, body)
    assert "phase" not in (created.get("status") or {})


async def test_a_name_is_taken_once(target: Target) -> None:
    await target.client.create(TASKS, task("t1"))
    with pytest.raises(AlreadyExists):
        await target.client.create(TASKS, task("t1"))
    await target.client.create(TASKS, task("t1", namespace="other"))  # names are per namespace


async def test_reading_a_missing_object_is_not_found(target: Target) -> None:
    with pytest.raises(NotFound) as caught:
        await target.client.get(TASKS, "nope", namespace="default")
    assert caught.value.code == 404
    assert "nope" in caught.value.message


async def test_a_stale_resource_version_conflicts(target: Target) -> None:
    created = await target.client.create(TASKS, task("t1"))
    fresh = dict(created, spec={**created["spec"], "revision": 2})
    updated = await target.client.update(TASKS, fresh)
    assert updated["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    stale = dict(created, spec={**created["spec"], "revision": 3})
    with pytest.raises(Conflict) as caught:
        await target.client.update(TASKS, stale)
    assert caught.value.retryable


async def test_generation_counts_spec_changes_only(target: Target) -> None:
    created = await target.client.create(TASKS, task("t1"))
    labelled = await target.client.update(TASKS, {**created, "metadata": {**created["metadata"], "labels": {"a": "b"}}})
    assert labelled["metadata"]["generation"] == 1
    assert labelled["metadata"]["labels"] == {"a": "b"}
    bumped = await target.client.update(TASKS, {**labelled, "spec": {**labelled["spec"], "revision": 2}})
    assert bumped["metadata"]["generation"] == 2


async def test_an_unchanged_update_writes_nothing(target: Target) -> None:
    created = await target.client.create(TASKS, task("t1"))
    again = await target.client.update(TASKS, created)
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


async def test_status_and_spec_are_written_separately(target: Target) -> None:
    created = await target.client.create(TASKS, task("t1"))
    with_status = {**created, "status": {"phase": "Running", "observedRevision": 1}}
    with_status["spec"] = {**created["spec"], "revision": 5}
    status_written = await target.client.update_status(TASKS, with_status)
    assert status_written["status"]["phase"] == "Running"
    assert status_written["spec"]["revision"] == 1, "update_status leaves the spec alone"
    assert status_written["metadata"]["generation"] == 1
    spec_written = await target.client.update(
        TASKS, {**status_written, "spec": {**status_written["spec"], "revision": 2}, "status": {"phase": "Lost"}}
    )
    assert spec_written["spec"]["revision"] == 2
    assert spec_written["status"]["phase"] == "Running", "update leaves the status alone"


async def test_merge_patch_and_json_patch(target: Target) -> None:
    await target.client.create(TASKS, task("t1", labels={"keep": "1", "drop": "1"}))
    merged = await target.client.patch(
        TASKS, "t1", {"metadata": {"labels": {"drop": None, "new": "x"}}}, namespace="default"
    )
    assert merged["metadata"]["labels"] == {"keep": "1", "new": "x"}
    patched = await target.client.patch(
        TASKS, "t1", [{"op": "replace", "path": "/spec/revision", "value": 3}], namespace="default", patch_type="json"
    )
    assert patched["spec"]["revision"] == 3
    assert patched["metadata"]["generation"] == 2
    status = await target.client.patch(
        TASKS, "t1", {"status": {"phase": "Running"}}, namespace="default", subresource="status"
    )
    assert status["status"]["phase"] == "Running"
    with pytest.raises(Conflict):
        await target.client.patch(
            TASKS,
            "t1",
            {"metadata": {"resourceVersion": merged["metadata"]["resourceVersion"]}, "spec": {"revision": 9}},
            namespace="default",
        )


async def test_list_by_namespace_and_label_selector(target: Target) -> None:
    await target.client.create(TASKS, task("a", labels={"team": "x", "tier": "1"}))
    await target.client.create(TASKS, task("b", labels={"team": "y"}))
    await target.client.create(TASKS, task("c"))
    await target.client.create(TASKS, task("d", namespace="other", labels={"team": "x"}))

    async def names(namespace: str | None, selector: str | None = None) -> list[str]:
        listing = await target.client.list(TASKS, namespace=namespace, label_selector=selector)
        assert listing.resource_version
        return sorted(item["metadata"]["name"] for item in listing.items)

    assert await names("default") == ["a", "b", "c"]
    assert await names(None) == ["a", "b", "c", "d"]
    assert await names(None, "team=x") == ["a", "d"]
    assert await names("default", "team in (x,y)") == ["a", "b"]
    assert await names("default", "team!=x") == ["b", "c"]
    assert await names("default", "!team") == ["c"]
    assert await names("default", "team,tier") == ["a"]
    listing = await target.client.list(TASKS, namespace="default")
    assert all(item["kind"] == "Task" and item["apiVersion"] == TASKS.api_version for item in listing.items)


async def test_delete_with_a_precondition(target: Target) -> None:
    created = await target.client.create(TASKS, task("t1"))
    await target.client.patch(TASKS, "t1", {"metadata": {"labels": {"a": "b"}}}, namespace="default")
    with pytest.raises(Conflict):
        await target.client.delete(
            TASKS, "t1", namespace="default", resource_version=created["metadata"]["resourceVersion"]
        )
    await target.client.delete(TASKS, "t1", namespace="default")
    with pytest.raises(NotFound):
        await target.client.get(TASKS, "t1", namespace="default")
    with pytest.raises(NotFound):
        await target.client.delete(TASKS, "t1", namespace="default")


async def test_finalizers_defer_deletion_until_removed(target: Target) -> None:
    body = task("t1")
    body["metadata"]["finalizers"] = ["loopd.dev/cleanup"]
    await target.client.create(TASKS, body)
    await target.client.delete(TASKS, "t1", namespace="default")
    marked = await target.client.get(TASKS, "t1", namespace="default")
    assert marked["metadata"]["deletionTimestamp"]
    await target.client.patch(TASKS, "t1", {"metadata": {"finalizers": None}}, namespace="default")
    with pytest.raises(NotFound):
        await target.client.get(TASKS, "t1", namespace="default")


async def test_deleting_an_owner_deletes_its_dependents(target: Target) -> None:
    owner = await target.client.create(TASKS, task("owner"))
    child = task("child")
    child["metadata"]["ownerReferences"] = [
        {
            "apiVersion": TASKS.api_version,
            "kind": "Task",
            "name": "owner",
            "uid": owner["metadata"]["uid"],
            "controller": True,
        }
    ]
    await target.client.create(TASKS, child)
    await target.client.delete(TASKS, "owner", namespace="default")

    async def deleted() -> bool:
        try:
            await target.client.get(TASKS, "child", namespace="default")
        except NotFound:
            return True
        return False

    await eventually(deleted, what="the dependent to be deleted")  # cascades may be asynchronous on a real server


async def test_leases_have_no_status_subresource(target: Target) -> None:
    spec = {"holderIdentity": "a", "leaseDurationSeconds": 15, "leaseTransitions": 0}
    created = await target.client.create(LEASES, {"metadata": {"name": "l1", "namespace": "default"}, "spec": spec})
    created["spec"]["holderIdentity"] = "b"
    updated = await target.client.update(LEASES, created)
    assert updated["spec"]["holderIdentity"] == "b"
    assert (await target.client.get(LEASES, "l1", namespace="default"))["spec"]["holderIdentity"] == "b"


# -- watch -----------------------------------------------------------------------------------------------------


async def test_watch_from_a_list_sees_every_later_change_in_order(target: Target) -> None:
    client: ResourceClient = target.client
    await client.create(TASKS, task("before"))
    listing = await client.list(TASKS, namespace="default")
    async with client.open_watch(TASKS, namespace="default", resource_version=listing.resource_version) as events:
        created = await client.create(TASKS, task("t1"))
        await client.update(TASKS, {**created, "spec": {**created["spec"], "revision": 2}})
        await client.delete(TASKS, "t1", namespace="default")
        await client.create(TASKS, task("elsewhere", namespace="other"))
        await client.create(TASKS, task("t2"))
        seen = await take(events, 4)
    assert summary(seen) == [("ADDED", "t1"), ("MODIFIED", "t1"), ("DELETED", "t1"), ("ADDED", "t2")]
    versions = [int(event.object["metadata"]["resourceVersion"]) for event in seen]
    assert versions == sorted(versions) and len(set(versions)) == 4
    assert seen[1].object["spec"]["revision"] == 2


async def test_a_watch_resumes_from_any_seen_resource_version(target: Target) -> None:
    client = target.client
    listing = await client.list(TASKS, namespace="default")
    first = await client.create(TASKS, task("t1"))
    await client.create(TASKS, task("t2"))
    await client.create(TASKS, task("t3"))
    async with client.open_watch(
        TASKS, namespace="default", resource_version=first["metadata"]["resourceVersion"]
    ) as events:
        assert summary(await take(events, 2)) == [("ADDED", "t2"), ("ADDED", "t3")]
    async with client.open_watch(TASKS, namespace="default", resource_version=listing.resource_version) as events:
        assert summary(await take(events, 3)) == [("ADDED", "t1"), ("ADDED", "t2"), ("ADDED", "t3")]


async def test_a_watch_without_a_version_starts_with_the_current_objects(target: Target) -> None:
    await target.client.create(TASKS, task("a"))
    await target.client.create(TASKS, task("b"))
    async with target.client.open_watch(TASKS, namespace="default") as events:
        initial = await take(events, 2)
        await target.client.create(TASKS, task("c"))
        later = await take(events, 1)
    assert sorted(summary(initial)) == [("ADDED", "a"), ("ADDED", "b")]
    assert summary(later) == [("ADDED", "c")]


async def test_a_too_old_resource_version_is_gone(target: Target) -> None:
    first = await target.client.create(TASKS, task("t0"))
    for index in range(HISTORY + 10):
        await target.client.patch(TASKS, "t0", {"metadata": {"labels": {"n": str(index)}}}, namespace="default")
    for _ in range(5):  # the store compacts its history in the background, on its pump's next turn
        await asyncio.sleep(0)
    with pytest.raises(Gone):
        async with target.client.open_watch(
            TASKS, namespace="default", resource_version=first["metadata"]["resourceVersion"], timeout_seconds=5
        ) as events:
            await take(events, 1, timeout=5)


async def test_an_object_leaving_a_watched_selector_is_reported_deleted(target: Target) -> None:
    listing = await target.client.list(TASKS, namespace="default")
    async with target.client.open_watch(
        TASKS, namespace="default", resource_version=listing.resource_version, label_selector="team=x"
    ) as events:
        await target.client.create(TASKS, task("t1", labels={"team": "x"}))
        await target.client.create(TASKS, task("other", labels={"team": "y"}))
        await target.client.patch(TASKS, "t1", {"metadata": {"labels": {"team": "y"}}}, namespace="default")
        await target.client.patch(TASKS, "other", {"metadata": {"labels": {"team": "x"}}}, namespace="default")
        seen = await take(events, 3)
    assert summary(seen) == [("ADDED", "t1"), ("DELETED", "t1"), ("ADDED", "other")]


async def test_bookmarks_carry_a_version_to_resume_from(target: Target) -> None:
    listing = await target.client.list(TASKS, namespace="default")
    async with target.client.open_watch(
        TASKS,
        namespace="default",
        resource_version=listing.resource_version,
        label_selector="team=x",
        allow_bookmarks=True,
    ) as events:
        await target.client.create(TASKS, task("unwatched", labels={"team": "y"}))
        target.request_bookmark()
        async with asyncio.timeout(10):
            bookmark = await anext(aiter(events))
    assert bookmark.type == "BOOKMARK"
    version = bookmark.object["metadata"]["resourceVersion"]
    assert int(version) >= int(listing.resource_version)
    async with target.client.open_watch(TASKS, namespace="default", resource_version=version) as events:
        await target.client.create(TASKS, task("next"))
        assert summary(await take(events, 1)) == [("ADDED", "next")]


async def test_a_watch_ends_after_its_timeout(target: Target) -> None:
    listing = await target.client.list(TASKS, namespace="default")
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(10):
        async with target.client.open_watch(
            TASKS,
            namespace="default",
            resource_version=listing.resource_version,
            timeout_seconds=1,
            allow_bookmarks=False,
        ) as events:
            remaining = [event async for event in events]
    assert remaining == []
    assert 0.5 <= loop.time() - started < 9
