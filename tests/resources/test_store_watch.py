"""Store contract, part 3: list + watch, resume, expiry (410), bookmarks, overflow (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loopd.resources import LEASE_KIND, TASK_KIND, Gone, ResourceStore
from loopd.resources._semantics import SemanticStore
from tests.resources.helpers import events, lease, next_event, no_event, rv, task
from tests.support.waiting import eventually


async def test_watch_from_list_version_sees_every_later_change_in_order(store: ResourceStore) -> None:
    await store.create(TASK_KIND, task("before"))
    listed = await store.list(TASK_KIND)
    async with store.watch(TASK_KIND, resource_version=listed.resource_version) as stream:
        await store.create(TASK_KIND, task("t1"))
        await store.create(LEASE_KIND, lease("not-a-task"))
        await store.patch(TASK_KIND, "t1", {"status": {"phase": "Running"}}, subresource="status")
        await store.delete(TASK_KIND, "t1")
        seen = await events(stream, 3)
        assert [(e.type, e.object["metadata"]["name"]) for e in seen] == [
            ("ADDED", "t1"),
            ("MODIFIED", "t1"),
            ("DELETED", "t1"),
        ]
        assert seen[1].object["status"] == {"phase": "Running"}
        versions = [rv(e.object) for e in seen]
        assert versions == sorted(versions) and versions[0] > int(listed.resource_version)
        await no_event(stream)


async def test_watch_without_version_starts_with_current_state(store: ResourceStore) -> None:
    await store.create(TASK_KIND, task("a"))
    await store.create(TASK_KIND, task("b", namespace="other"))
    async with store.watch(TASK_KIND, namespace="default") as stream:
        first = await next_event(stream)
        assert (first.type, first.object["metadata"]["name"]) == ("ADDED", "a")
        await store.create(TASK_KIND, task("c"))
        assert (await next_event(stream)).object["metadata"]["name"] == "c"


async def test_watch_resumes_from_an_old_version(store: ResourceStore) -> None:
    start = await store.current_resource_version()
    await store.create(TASK_KIND, task("a"))
    middle = (await store.create(TASK_KIND, task("b")))["metadata"]["resourceVersion"]
    await store.patch(TASK_KIND, "a", {"spec": {"revision": 2}})
    async with store.watch(TASK_KIND, resource_version=start) as stream:
        replay = await events(stream, 3)
    assert [(e.type, e.object["metadata"]["name"]) for e in replay] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("MODIFIED", "a"),
    ]
    async with store.watch(TASK_KIND, resource_version=middle) as stream:
        event = await next_event(stream)
        assert (event.type, event.object["spec"]["revision"]) == ("MODIFIED", 2)


async def test_label_selector_transitions_become_added_and_deleted(store: ResourceStore) -> None:
    await store.create(TASK_KIND, task("t1", labels={"team": "a"}))
    async with store.watch(
        TASK_KIND, resource_version=await store.current_resource_version(), label_selector="team=b"
    ) as stream:
        await store.patch(TASK_KIND, "t1", {"metadata": {"labels": {"team": "b"}}})
        await store.patch(TASK_KIND, "t1", {"spec": {"revision": 2}})
        await store.patch(TASK_KIND, "t1", {"metadata": {"labels": {"team": "a"}}})
        await store.patch(TASK_KIND, "t1", {"spec": {"revision": 3}})
        seen = await events(stream, 3)
        assert [e.type for e in seen] == ["ADDED", "MODIFIED", "DELETED"]
        await no_event(stream)


async def test_too_old_version_is_gone_and_a_relist_recovers(open_store: Any) -> None:
    store: ResourceStore = await open_store(event_window=5, poll_interval=0.05)
    start = await store.current_resource_version()
    for index in range(20):
        await store.create(TASK_KIND, task(f"t{index}"))
    caught: list[Gone] = []

    async def expired() -> bool:
        try:
            async with store.watch(TASK_KIND, resource_version=start):
                return False
        except Gone as exc:
            caught.append(exc)
            return True

    # Compaction runs in the background once the pump catches up: wait for its effect, not for time.
    await eventually(expired, what="the event log compacted past the start version")
    gone = caught[-1]
    assert gone.code == 410 and gone.to_status()["reason"] == "Expired"
    relisted = await store.list(TASK_KIND)
    assert len(relisted.items) == 20
    async with store.watch(TASK_KIND, resource_version=relisted.resource_version) as stream:
        await store.delete(TASK_KIND, "t3")
        assert (await next_event(stream)).type == "DELETED"


async def test_slow_watcher_is_expired_without_blocking_writers(open_store: Any) -> None:
    store: ResourceStore = await open_store(watch_queue_size=3)
    async with store.watch(TASK_KIND, resource_version=await store.current_resource_version()) as slow:
        async with asyncio.timeout(10):
            for index in range(10):
                await store.create(TASK_KIND, task(f"t{index}"))
        async with store.watch(TASK_KIND, resource_version=await store.current_resource_version()) as fast:
            await store.create(TASK_KIND, task("last"))
            assert (await next_event(fast)).object["metadata"]["name"] == "last"
        with pytest.raises(Gone):
            for _ in range(10):
                await next_event(slow)


async def test_bookmarks_report_progress(open_store: Any) -> None:
    store: ResourceStore = await open_store(bookmark_interval=0.1)
    async with store.watch(
        TASK_KIND, resource_version=await store.current_resource_version(), bookmarks=True
    ) as stream:
        await store.create(LEASE_KIND, lease("unrelated"))  # moves the version, no Task event
        bookmark = await next_event(stream)
        assert bookmark.type == "BOOKMARK"
        assert bookmark.object["kind"] == "Task"
        assert bookmark.object["metadata"]["resourceVersion"] == await store.current_resource_version()


async def test_closing_the_store_ends_watches(open_store: Any) -> None:
    store: ResourceStore = await open_store()
    async with store.watch(TASK_KIND, resource_version=await store.current_resource_version()) as stream:
        await store.aclose()
        with pytest.raises(StopAsyncIteration):
            await next_event(stream)


async def test_changes_by_another_store_instance_reach_watchers(open_store: Any) -> None:
    writer: ResourceStore = await open_store(poll_interval=0.1)
    reader: ResourceStore = await open_store(poll_interval=0.1)
    async with reader.watch(TASK_KIND, resource_version=await reader.current_resource_version()) as stream:
        await writer.create(TASK_KIND, task("remote"))
        event = await next_event(stream)
        assert (event.type, event.object["metadata"]["name"]) == ("ADDED", "remote")


async def test_watch_events_are_private_copies(store: ResourceStore) -> None:
    version = await store.current_resource_version()
    async with (
        store.watch(TASK_KIND, resource_version=version) as one,
        store.watch(TASK_KIND, resource_version=version) as two,
    ):
        await store.create(TASK_KIND, task("t1"))
        first = await next_event(one)
        first.object["spec"]["target"]["key"] = "mutated"
        assert (await next_event(two)).object["spec"]["target"]["key"] == "router"


async def test_a_store_hands_its_own_writes_to_its_watches_without_reading_them_back(
    open_store: Any, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a store commits reaches its open watches at once, with no read of the event log; once another writer
    committed in between, the log is read (in order: the other's change first)."""
    if backend == "memory":
        pytest.skip("the in-memory store dispatches every commit by reading its log at once")
    reads: list[int] = []
    original = SemanticStore._read_changes

    async def counted(self: SemanticStore, after: int, limit: int) -> Any:
        reads.append(after)
        return await original(self, after, limit)

    monkeypatch.setattr(SemanticStore, "_read_changes", counted)
    here: ResourceStore = await open_store(poll_interval=3600.0)
    other: ResourceStore = await open_store(poll_interval=3600.0)
    async with here.watch(TASK_KIND, resource_version=await here.current_resource_version()) as stream:
        await asyncio.sleep(0.05)  # whatever the stores' starts woke has been read
        reads.clear()
        await here.create(TASK_KIND, task("t1"))
        assert (await next_event(stream)).object["metadata"]["name"] == "t1"
        if backend == "sqlite":  # on PostgreSQL the write's own NOTIFY wakes the pump as well (it then reads nothing)
            assert reads == []
        await other.create(TASK_KIND, task("t2"))
        await here.create(TASK_KIND, task("t3"))  # it does not follow what `here` handed out: the log is read
        names = [(await next_event(stream)).object["metadata"]["name"] for _ in range(2)]
        assert names == ["t2", "t3"] and reads
