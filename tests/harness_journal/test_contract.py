"""The Journal contract, on every implementation: memory, SQLite and PostgreSQL.

Sequences start at 1 and have no gaps; an append stores all its records or none; opening a writer fences the
earlier one (also from another replica over the same storage); reads honour ranges; followers see later appends;
many sessions append concurrently; a session restored through the Rig rebuilds the same state; state snapshots
are kept per session (the newest), shared with forks only up to the fork point, and a restore from one equals a
full replay.
"""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from loopd.harness import (
    EchoTool,
    ForkPointError,
    JournalError,
    JournalFencedError,
    LoopDefinition,
    Reply,
    Rig,
    ScriptedModel,
    SessionBusyError,
    SessionNotFoundError,
)
from loopd.harness._errors import SnapshotSeqError
from loopd.harness.core import codec, fold
from loopd.harness.core.events import TurnDone
from loopd.harness.core.snapshot import encode_state, state_schema
from loopd.harness.journal import Journal, NewRecord, Record, replay, restore_state
from tests.support.waiting import eventually

from .conftest import Storage, records


async def seqs_of(journal: Journal, session_id: str) -> list[int]:
    return [r.seq for r in await journal.read(session_id)]


def payloads(rs: list[Record]) -> list[tuple[str, int, bytes, float]]:
    return [(r.kind, r.version, r.data, r.at) for r in rs]


async def collect(journal: Journal, session_id: str, from_seq: int, until: int, *, poll: float) -> list[Record]:
    out: list[Record] = []
    async for record in journal.follow(session_id, from_seq, poll_interval=poll):
        out.append(record)
        if record.seq >= until:
            break
    return out


# --- sequences and atomicity ---------------------------------------------------------------------------------


async def test_seqs_start_at_one_and_have_no_gaps(journal: Journal) -> None:
    writer = await journal.create_session("s", at=1.0)
    assert writer.session_id == "s" and writer.last_seq == 0
    assert await writer.append(records(1)) == [1]
    assert await writer.append(records(3)) == [2, 3, 4]
    assert await writer.append([]) == []
    assert await writer.append(records(2)) == [5, 6]
    assert writer.last_seq == 6
    assert await seqs_of(journal, "s") == [1, 2, 3, 4, 5, 6]
    info = await journal.session("s")
    assert info is not None and info.last_seq == 6


async def test_appends_that_need_no_sync_yet_are_stored_alike_and_sync_makes_them_durable(journal: Journal) -> None:
    """``sync=False`` only lets a journal that `defers_sync` skip the disk flush until `sync`; seqs, reads and
    atomicity are the same, interleaved with synced appends."""
    writer = await journal.create_session("s", at=1.0)
    assert await writer.append(records(2, tag="lazy"), sync=False) == [1, 2]
    assert await writer.append(records(1, tag="synced")) == [3]
    assert await writer.append(records(1, tag="lazy"), sync=False) == [4]
    await writer.sync()
    await writer.sync()  # nothing left: returns at once
    stored = await journal.read("s")
    assert [r.seq for r in stored] == [1, 2, 3, 4]
    assert [json.loads(r.data)["tag"] for r in stored] == ["lazy", "lazy", "synced", "lazy"]
    assert writer.last_seq == 4


async def test_what_is_read_back_is_what_was_appended(journal: Journal) -> None:
    writer = await journal.create_session("s", meta='{"rig":"x"}', at=7.5)
    batch = [
        NewRecord("model_replied", 3, b'{"text":"h\xc3\xa9"}', 1.25),
        NewRecord("raw", 1, bytes(range(256)), 2.5),
        NewRecord("empty", 0, b"", 0.0),
    ]
    await writer.append(batch)
    stored = await journal.read("s")
    assert payloads(stored) == [(r.kind, r.version, r.data, r.at) for r in batch]
    assert {r.session_id for r in stored} == {"s"}


async def test_sessions_are_independent(journal: Journal) -> None:
    a = await journal.create_session("a", at=1.0)
    b = await journal.create_session("b", at=1.0)
    assert await a.append(records(2)) == [1, 2]
    assert await b.append(records(1)) == [1]
    assert await a.append(records(1)) == [3]
    assert await seqs_of(journal, "b") == [1]


async def test_an_append_that_fails_stores_none_of_its_records(storage: Storage) -> None:
    journal = await storage.open()
    await storage.refuse_kind("poison")
    writer = await journal.create_session("s", at=1.0)
    assert await writer.append(records(2)) == [1, 2]
    batch = [*records(2, tag="x"), NewRecord("poison", 1, b"{}", 0.0), *records(2, tag="y")]
    with pytest.raises(JournalError, match="injected failure") as caught:
        await writer.append(batch)
    assert not isinstance(caught.value, JournalFencedError)
    assert await seqs_of(journal, "s") == [1, 2]
    # The failure is not a fence: the same writer goes on, with no gap.
    assert await writer.append(records(1, tag="z")) == [3]
    assert [json.loads(r.data)["tag"] for r in await journal.read("s")] == ["", "", "z"]


async def test_unknown_and_duplicate_sessions_are_typed_errors(journal: Journal) -> None:
    await journal.create_session("s", at=1.0)
    with pytest.raises(SessionBusyError):
        await journal.create_session("s", at=2.0)
    with pytest.raises(SessionNotFoundError):
        await journal.open_writer("nope")
    with pytest.raises(SessionNotFoundError):
        await journal.read("nope")
    with pytest.raises(SessionNotFoundError):
        await anext(aiter(journal.follow("nope")))
    assert await journal.session("nope") is None


async def test_a_closed_writer_refuses_appends(journal: Journal) -> None:
    writer = await journal.create_session("s", at=1.0)
    await writer.aclose()
    with pytest.raises(JournalError):
        await writer.append(records(1))
    assert await seqs_of(journal, "s") == []


# --- fencing -------------------------------------------------------------------------------------------------


async def test_a_second_writer_fences_the_first(journal: Journal) -> None:
    first = await journal.create_session("s", at=1.0)
    await first.append(records(2))
    second = await journal.open_writer("s")
    assert second.last_seq == 2
    with pytest.raises(JournalFencedError):
        await first.append(records(3, tag="fenced"))
    assert await seqs_of(journal, "s") == [1, 2]
    assert await second.append(records(1)) == [3]
    third = await journal.open_writer("s")
    with pytest.raises(JournalFencedError):
        await second.append(records(1, tag="fenced"))
    assert await third.append(records(1)) == [4]
    assert all(json.loads(r.data)["tag"] != "fenced" for r in await journal.read("s"))


async def test_a_writer_on_replica_b_takes_over_from_replica_a(storage: Storage) -> None:
    replica_a = await storage.open()
    replica_b = await storage.open()
    on_a = await replica_a.create_session("s", at=1.0)
    assert await on_a.append(records(3)) == [1, 2, 3]
    on_b = await replica_b.open_writer("s")
    assert on_b.last_seq == 3
    with pytest.raises(JournalFencedError):
        await on_a.append(records(2, tag="fenced"))
    assert await on_b.append(records(1, tag="b")) == [4]
    for replica in (replica_a, replica_b):
        stored = await replica.read("s")
        assert [r.seq for r in stored] == [1, 2, 3, 4]
        assert [json.loads(r.data)["tag"] for r in stored][-1] == "b"


async def test_a_takeover_racing_appends_loses_nothing_and_stores_nothing_fenced(storage: Storage) -> None:
    replica_a = await storage.open()
    replica_b = await storage.open()
    on_a = await replica_a.create_session("s", at=1.0)
    acknowledged: list[int] = []

    async def keep_appending() -> None:
        with pytest.raises(JournalFencedError):
            for i in range(10_000):
                acknowledged.extend(await on_a.append(records(1 + i % 3, tag="a")))

    task = asyncio.create_task(keep_appending())
    await eventually(lambda: len(acknowledged) >= 10, what="ten acknowledged appends")
    on_b = await replica_b.open_writer("s")
    await asyncio.wait_for(task, 20)
    taken_at = on_b.last_seq
    assert acknowledged == list(range(1, taken_at + 1))  # every acknowledged append is kept, nothing after
    assert await on_b.append(records(1, tag="b")) == [taken_at + 1]
    assert await seqs_of(replica_a, "s") == list(range(1, taken_at + 2))


# --- reading -------------------------------------------------------------------------------------------------


async def test_read_honours_from_seq_and_limit(journal: Journal) -> None:
    writer = await journal.create_session("s", at=1.0)
    await writer.append(records(10))
    assert [r.seq for r in await journal.read("s")] == list(range(1, 11))
    assert [r.seq for r in await journal.read("s", 4, 3)] == [4, 5, 6]
    assert [r.seq for r in await journal.read("s", 9)] == [9, 10]
    assert [r.seq for r in await journal.read("s", 8, 100)] == [8, 9, 10]
    assert [r.seq for r in await journal.read("s", 0, 2)] == [1, 2]
    assert await journal.read("s", 11) == []
    assert await journal.read("s", 3, 0) == []
    assert [json.loads(r.data)["i"] for r in await journal.read("s", 5, 2)] == [4, 5]


async def test_sessions_lists_newest_first_with_their_heads(storage: Storage) -> None:
    journal = await storage.open()
    for name, at in (("old", 1.0), ("new", 3.0), ("mid", 2.0)):
        writer = await journal.create_session(name, meta=f"meta-{name}", at=at)
        await writer.append(records(int(at)))
    listed = await journal.sessions()
    assert [(s.session_id, s.created_at, s.last_seq, s.meta) for s in listed] == [
        ("new", 3.0, 3, "meta-new"),
        ("mid", 2.0, 2, "meta-mid"),
        ("old", 1.0, 1, "meta-old"),
    ]
    assert [s.session_id for s in await journal.sessions(limit=2)] == ["new", "mid"]
    # Another replica sees the same sessions.
    other = await storage.open()
    assert [s.session_id for s in await other.sessions()] == ["new", "mid", "old"]
    info = await other.session("mid")
    assert info is not None and (info.last_seq, info.meta) == (2, "meta-mid")


# --- following -----------------------------------------------------------------------------------------------


async def test_follow_yields_stored_then_later_records(storage: Storage) -> None:
    journal = await storage.open()
    writer = await journal.create_session("s", at=1.0)
    await writer.append(records(3))
    follower = asyncio.create_task(collect(journal, "s", 2, 6, poll=60))
    # The follower has read the stored records and waits (its poll is a minute of virtual time away: only the
    # appends' wake-up can bring the later records).
    await eventually(lambda: storage.clock.sleepers == 1, what="the follower to wait")
    await writer.append(records(1, tag="later"))
    await writer.append(records(2, tag="later"))
    got = await asyncio.wait_for(follower, 10)
    assert [r.seq for r in got] == [2, 3, 4, 5, 6]
    assert payloads(got) == payloads(await journal.read("s", 2))


async def test_a_follower_on_another_replica_sees_appends(storage: Storage) -> None:
    replica_a = await storage.open()
    replica_b = await storage.open()
    writer = await replica_a.create_session("s", at=1.0)
    await writer.append(records(1))
    follower = asyncio.create_task(collect(replica_b, "s", 1, 4, poll=0.1))
    await eventually(lambda: storage.clock.sleepers == 1, what="the follower to wait")
    for _ in range(3):
        await writer.append(records(1))
    # A wake-up reaches a follower on another replica only through PostgreSQL's notifications; its next poll
    # (here due on the virtual clock) reads the appends on any backend.
    await storage.clock.advance(0.1)
    got = await asyncio.wait_for(follower, 10)
    assert [r.seq for r in got] == [1, 2, 3, 4]


# --- concurrency ---------------------------------------------------------------------------------------------


async def test_fifty_sessions_appending_concurrently_all_land(storage: Storage) -> None:
    replicas = [await storage.open(), await storage.open()]
    rng = random.Random(7)
    plans = {f"s{i}": [rng.randint(1, 4) for _ in range(8)] for i in range(50)}
    writers = {sid: await replicas[i % 2].create_session(sid, at=float(i)) for i, sid in enumerate(sorted(plans))}

    async def drive(sid: str) -> None:
        for step, size in enumerate(plans[sid]):
            await writers[sid].append(records(size, tag=f"{sid}/{step}"))

    await asyncio.gather(*(drive(sid) for sid in plans))
    for sid, sizes in plans.items():
        stored = await replicas[0].read(sid)
        assert [r.seq for r in stored] == list(range(1, sum(sizes) + 1))
        expected = [f"{sid}/{step}" for step, size in enumerate(sizes) for _ in range(size)]
        assert [json.loads(r.data)["tag"] for r in stored] == expected
    appends = sum(len(sizes) for sizes in plans.values())
    commits = sum(getattr(r, "commits", 0) for r in {id(r): r for r in replicas}.values())
    if storage.backend != "memory":
        # Group commit: concurrent appends share transactions.
        assert 0 < commits < appends / 4, (commits, appends)


# --- restore through the rig ---------------------------------------------------------------------------------


def tool_rig(journal: Journal) -> Rig:
    model = ScriptedModel(
        [Reply(tool_calls=[("echo", {"text": "one"}), ("echo", {"text": "two"})]), Reply(text="done")],
        default=Reply(text="again"),
    )
    return Rig(loops=[LoopDefinition(name="main", model=model, tools=(EchoTool(),))], journal=journal)


async def test_restore_on_another_replica_rebuilds_the_same_state_and_fences_the_first(storage: Storage) -> None:
    replica_a = await storage.open()
    replica_b = await storage.open()
    session = await tool_rig(replica_a).start_session()
    assert isinstance(await session.ask("go", timeout=10), TurnDone)
    live = dict(session.state.loops)
    old_writer = session.log.writer
    session.abort()  # replica A dies without a goodbye

    restored = await tool_rig(replica_b).restore_session(session.id)
    try:
        assert dict(restored.state.loops) == live
        stored = await replica_b.read(session.id)
        assert [r.seq for r in stored] == list(range(1, len(stored) + 1))
        rebuilt = fold((r.seq, codec.decode(r.kind, r.version, r.data)) for r in stored)
        assert dict(rebuilt.loops) == live
        history = live["main"].history
        assert [m.content for m in history if m.role == "tool"] == ["one", "two"]
        with pytest.raises(JournalFencedError):
            await old_writer.append(records(1, tag="late"))
        # The restored session goes on where the first one stopped.
        assert isinstance(await restored.ask("more", timeout=10), TurnDone)
    finally:
        await restored.shutdown()
    stored = await replica_a.read(session.id)
    assert [r.seq for r in stored] == list(range(1, len(stored) + 1))
    assert all(r.kind != "k" for r in stored)


# --- forks ---------------------------------------------------------------------------------------------------


def tags(rs: list[Record]) -> list[tuple[int, str, int]]:
    return [(r.seq, json.loads(r.data)["tag"], json.loads(r.data)["i"]) for r in rs]


async def test_a_fork_shares_its_parents_prefix_and_numbers_its_own_records_after_it(storage: Storage) -> None:
    journal = await storage.open()
    parent = await journal.create_session("p", meta="parent", at=1.0)
    await parent.append(records(5, tag="p"))
    fork = await journal.fork_session("p", 3, "f", meta="fork", at=2.0)
    assert (fork.session_id, fork.last_seq) == ("f", 3)
    assert await fork.append(records(2, tag="f")) == [4, 5]
    assert fork.last_seq == 5
    stored = await journal.read("f")
    assert tags(stored) == [(1, "p", 0), (2, "p", 1), (3, "p", 2), (4, "f", 0), (5, "f", 1)]
    assert {r.session_id for r in stored} == {"f"}
    assert payloads(stored[:3]) == payloads(await journal.read("p", 1, 3))
    # The parent goes on untouched by its fork, and the fork by its parent's later records.
    assert await parent.append(records(1, tag="p2")) == [6]
    assert tags(await journal.read("p"))[-1] == (6, "p2", 0)
    assert [r.seq for r in await journal.read("f")] == [1, 2, 3, 4, 5]
    info = await journal.session("f")
    assert info is not None
    assert (info.last_seq, info.meta, info.parent_id, info.parent_seq) == (5, "fork", "p", 3)
    plain = await journal.session("p")
    assert plain is not None and (plain.parent_id, plain.parent_seq, plain.last_seq) == (None, 0, 6)
    listed = {s.session_id: (s.parent_id, s.parent_seq, s.last_seq) for s in await journal.sessions()}
    assert listed == {"p": (None, 0, 6), "f": ("p", 3, 5)}


async def test_reads_of_a_fork_honour_ranges_across_the_shared_prefix(journal: Journal) -> None:
    parent = await journal.create_session("p", at=1.0)
    await parent.append(records(6, tag="p"))
    fork = await journal.fork_session("p", 4, "f", at=1.0)
    await fork.append(records(3, tag="f"))
    assert [r.seq for r in await journal.read("f", 3, 3)] == [3, 4, 5]
    assert tags(await journal.read("f", 4, 2)) == [(4, "p", 3), (5, "f", 0)]
    assert [r.seq for r in await journal.read("f", 6)] == [6, 7]
    assert [r.seq for r in await journal.read("f", 0, 2)] == [1, 2]
    assert await journal.read("f", 8) == []
    assert await journal.read("f", 2, 0) == []


async def test_forks_of_forks_resolve_through_every_ancestor(journal: Journal) -> None:
    root = await journal.create_session("r", at=1.0)
    await root.append(records(4, tag="r"))
    child = await journal.fork_session("r", 3, "c", at=1.0)
    await child.append(records(3, tag="c"))  # c: r1..r3, c4..c6
    deep = await journal.fork_session("c", 5, "g", at=1.0)  # g: r1..r3, c4, c5, then its own
    assert deep.last_seq == 5
    assert await deep.append(records(1, tag="g")) == [6]
    assert [t[:2] for t in tags(await journal.read("g"))] == [
        (1, "r"),
        (2, "r"),
        (3, "r"),
        (4, "c"),
        (5, "c"),
        (6, "g"),
    ]
    shallow = await journal.fork_session("c", 2, "h", at=1.0)  # inside c's shared prefix: only r1, r2
    assert [t[:2] for t in tags(await journal.read("h"))] == [(1, "r"), (2, "r")]
    assert await shallow.append(records(1, tag="h")) == [3]
    assert [t[:2] for t in tags(await journal.read("h", 2))] == [(2, "r"), (3, "h")]


async def test_fork_errors_are_typed(journal: Journal) -> None:
    parent = await journal.create_session("p", at=1.0)
    await parent.append(records(2))
    with pytest.raises(SessionNotFoundError):
        await journal.fork_session("nope", 1, "f", at=1.0)
    for bad in (0, 3, -1):
        with pytest.raises(ForkPointError, match=r"1\.\.2"):
            await journal.fork_session("p", bad, "f", at=1.0)
    with pytest.raises(SessionBusyError):
        await journal.fork_session("p", 1, "p", at=1.0)
    assert await journal.session("f") is None  # nothing was created by the refusals
    await journal.fork_session("p", 2, "f", at=1.0)
    with pytest.raises(SessionBusyError):
        await journal.fork_session("p", 1, "f", at=1.0)


async def test_a_fork_is_fenced_restored_and_followed_like_any_session(storage: Storage) -> None:
    replica_a = await storage.open()
    replica_b = await storage.open()
    parent = await replica_a.create_session("p", at=1.0)
    await parent.append(records(3, tag="p"))
    first = await replica_a.fork_session("p", 2, "f", at=1.0)
    await first.append(records(1, tag="f"))
    second = await replica_b.open_writer("f")  # another replica (its caches cold) takes the fork over
    assert second.last_seq == 3
    with pytest.raises(JournalFencedError):
        await first.append(records(1, tag="fenced"))
    follower = asyncio.create_task(collect(replica_b, "f", 1, 5, poll=60))
    await eventually(lambda: storage.clock.sleepers == 1, what="the follower to wait")
    assert await second.append(records(2, tag="b")) == [4, 5]
    got = await asyncio.wait_for(follower, 10)
    assert [t[:2] for t in tags(got)] == [(1, "p"), (2, "p"), (3, "f"), (4, "b"), (5, "b")]
    assert [t[:2] for t in tags(await replica_a.read("f"))] == [(1, "p"), (2, "p"), (3, "f"), (4, "b"), (5, "b")]


async def test_a_forked_rig_session_rebuilds_the_parents_state_at_the_fork(storage: Storage) -> None:
    replica_a = await storage.open()
    replica_b = await storage.open()
    session = await tool_rig(replica_a).start_session()
    try:
        assert isinstance(await session.ask("go", timeout=10), TurnDone)
        settled = session.last_seq
        assert isinstance(await session.ask("again", timeout=10), TurnDone)
        parent_state = session.state
    finally:
        await session.shutdown()
    fork = await tool_rig(replica_b).fork_session(session.id, settled)
    try:
        head = await replica_b.read(session.id, 1, settled)
        assert dict(fork.state.loops) == dict(replay(head).loops)
        assert fork.state.loops["main"].turns == 1 and parent_state.loops["main"].turns == 2
        assert isinstance(await fork.ask("other", timeout=10), TurnDone)
    finally:
        await fork.shutdown()
    stored = await replica_a.read(fork.id)
    assert [r.seq for r in stored] == list(range(1, len(stored) + 1))
    assert payloads(stored[:settled]) == payloads(head)
    assert stored[settled].kind == "session_forked"


# --- state snapshots -----------------------------------------------------------------------------------------


async def test_a_session_keeps_its_newest_snapshot_of_a_schema(storage: Storage) -> None:
    journal = await storage.open()
    writer = await journal.create_session("s", at=1.0)
    await writer.append(records(6))
    assert await journal.load_snapshot("s", "v1") is None
    await journal.save_snapshot("s", 3, "v1", b"three", at=2.0)
    got = await journal.load_snapshot("s", "v1")
    assert got is not None and (got.seq, got.schema, got.data, got.at) == (3, "v1", b"three", 2.0)
    await journal.save_snapshot("s", 5, "v1", b"five", at=3.0)
    await journal.save_snapshot("s", 4, "v1", b"four, late", at=4.0)  # a late save never replaces a newer one
    assert (await journal.load_snapshot("s", "v1")).data == b"five"  # type: ignore[union-attr]
    assert await journal.load_snapshot("s", "v1", upto=4) is None  # only the newest is kept
    assert await journal.load_snapshot("s", "v2") is None  # another schema's is never returned
    await journal.save_snapshot("s", 2, "v2", b"two, new schema", at=5.0)  # a new schema replaces it, older or not
    assert await journal.load_snapshot("s", "v1") is None
    assert (await journal.load_snapshot("s", "v2")).data == b"two, new schema"  # type: ignore[union-attr]
    # The snapshot is beside the records, never one of them.
    assert [r.seq for r in await journal.read("s")] == [1, 2, 3, 4, 5, 6]
    other = await storage.open()  # a replica sees it too
    assert (await other.load_snapshot("s", "v2")).seq == 2  # type: ignore[union-attr]


async def test_snapshot_errors_are_typed(journal: Journal) -> None:
    writer = await journal.create_session("s", at=1.0)
    await writer.append(records(2))
    for bad in (0, 3):
        with pytest.raises(SnapshotSeqError):
            await journal.save_snapshot("s", bad, "v1", b"x", at=1.0)
    assert await journal.load_snapshot("s", "v1") is None
    with pytest.raises(SessionNotFoundError):
        await journal.save_snapshot("nope", 1, "v1", b"x", at=1.0)
    with pytest.raises(SessionNotFoundError):
        await journal.load_snapshot("nope", "v1")


async def test_a_fork_uses_its_parents_snapshot_only_at_or_before_the_fork_point(journal: Journal) -> None:
    parent = await journal.create_session("p", at=1.0)
    await parent.append(records(4, tag="p"))
    await journal.save_snapshot("p", 2, "v1", b"p@2", at=1.0)
    fork = await journal.fork_session("p", 3, "f", at=1.0)
    await fork.append(records(2, tag="f"))
    got = await journal.load_snapshot("f", "v1")
    assert got is not None and (got.seq, got.data) == (2, b"p@2")  # p's records 1..2 are f's too
    await journal.save_snapshot("p", 4, "v1", b"p@4", at=2.0)  # past the fork point: p's record 4 is not f's
    assert await journal.load_snapshot("f", "v1") is None
    assert (await journal.load_snapshot("p", "v1")).data == b"p@4"  # type: ignore[union-attr]
    await journal.save_snapshot("f", 5, "v1", b"f@5", at=3.0)  # the fork's own, over its own records
    assert (await journal.load_snapshot("f", "v1")).data == b"f@5"  # type: ignore[union-attr]
    assert await journal.load_snapshot("f", "v1", upto=4) is None
    assert (await journal.load_snapshot("p", "v1")).data == b"p@4"  # type: ignore[union-attr]  # untouched
    # A fork of the fork inside the shared prefix sees the root's snapshot only up to its own fork point.
    await journal.save_snapshot("p", 4, "v1", b"p@4 again", at=4.0)
    deep = await journal.fork_session("f", 4, "g", at=1.0)
    await deep.append(records(1, tag="g"))
    got = await journal.load_snapshot("g", "v1")
    assert got is None  # f's snapshot is at 5 (past g's fork point), p's at 4 is past f's fork point (3)
    await journal.save_snapshot("p", 1, "v2", b"p@1", at=5.0)
    got = await journal.load_snapshot("g", "v2")
    assert got is not None and (got.seq, got.data) == (1, b"p@1")


def snapshot_rig(journal: Journal, every: int | None) -> Rig:
    """`tool_rig` writing a state snapshot after every ``every`` records (None: none)."""
    rig = tool_rig(journal)
    return Rig(loops=rig.loops, journal=journal, state_snapshots=every)


async def test_restore_from_a_snapshot_rebuilds_what_a_full_replay_does(storage: Storage) -> None:
    replica_a = await storage.open()
    replica_b = await storage.open()
    session = await snapshot_rig(replica_a, 5).start_session()
    try:
        for text in ("go", "more", "again"):
            assert isinstance(await session.ask(text, timeout=10), TurnDone)
        assert session.log.snapshots is not None
        await session.log.snapshots.wait()
        assert session.log.snapshots.saves >= 1
    finally:
        await session.shutdown()
    stored = await replica_b.load_snapshot(session.id, state_schema())
    assert stored is not None and 5 <= stored.seq <= session.last_seq
    with_snapshot = await restore_state(replica_b, session.id)
    assert with_snapshot.snapshot_seq == stored.seq
    assert [r.seq for r in with_snapshot.records] == list(range(stored.seq + 1, session.last_seq + 1))
    full = await restore_state(replica_b, session.id, snapshots=False)
    assert full.snapshot_seq == 0 and len(full.records) == session.last_seq
    assert with_snapshot.state == full.state == replay(await replica_b.read(session.id))
    # A snapshot at any seq (inside a turn too) plus the records after it is the same state.
    other = await snapshot_rig(replica_a, None).start_session()
    try:
        for text in ("go", "more"):
            assert isinstance(await other.ask(text, timeout=10), TurnDone)
    finally:
        await other.shutdown()
    stored_records = await replica_a.read(other.id)
    whole = replay(stored_records)
    for cut in range(1, len(stored_records) + 1):
        await replica_a.save_snapshot(other.id, cut, state_schema(), encode_state(replay(stored_records[:cut])), at=1.0)
        got = await restore_state(replica_b, other.id)
        assert (got.snapshot_seq, len(got.records)) == (cut, len(stored_records) - cut)
        assert got.state == whole
    # Through the rig: the restored session goes on, and a rig without snapshots ignores them.
    restored = await snapshot_rig(replica_b, 5).restore_session(session.id)
    try:
        assert restored.state.loops == full.state.loops
        assert isinstance(await restored.ask("on", timeout=10), TurnDone)
    finally:
        await restored.shutdown()
    plain = await snapshot_rig(replica_b, None).restore_session(session.id)
    try:
        assert plain.log.snapshots is None
        assert plain.state.loops == (await restore_state(replica_b, session.id, snapshots=False)).state.loops
    finally:
        await plain.shutdown()


async def test_a_corrupt_or_stale_snapshot_is_ignored_and_the_journal_replayed(storage: Storage) -> None:
    journal = await storage.open()
    session = await snapshot_rig(journal, None).start_session()
    try:
        assert isinstance(await session.ask("go", timeout=10), TurnDone)
    finally:
        await session.shutdown()
    full = await restore_state(journal, session.id, snapshots=False)
    await journal.save_snapshot(session.id, 3, state_schema(), b"not a snapshot", at=1.0)
    got = await restore_state(journal, session.id)
    assert got.snapshot_seq == 0 and got.ignored is not None and "seq 3" in got.ignored
    assert got.state == full.state
    # A well-formed snapshot stored under the wrong seq is refused too (it does not hold what it claims).
    early = replay((await journal.read(session.id))[:2])
    await journal.save_snapshot(session.id, 3, state_schema(), encode_state(early), at=2.0)
    got = await restore_state(journal, session.id)
    assert got.snapshot_seq == 0 and got.state == full.state
    # A snapshot of another schema (an older build's) is not even loaded.
    await journal.save_snapshot(session.id, 3, "state-0-old", encode_state(early), at=3.0)
    got = await restore_state(journal, session.id)
    assert (got.snapshot_seq, got.ignored) == (0, None) and got.state == full.state
    # The restored session writes a fresh one once it is due.
    restored = await snapshot_rig(journal, 1).restore_session(session.id)
    try:
        assert restored.log.snapshots is not None
        await restored.log.snapshots.wait()
    finally:
        await restored.shutdown()
    fresh = await journal.load_snapshot(session.id, state_schema())
    assert fresh is not None and fresh.seq > full.state.last_seq
    assert (await restore_state(journal, session.id)).state == (
        await restore_state(journal, session.id, snapshots=False)
    ).state


async def test_a_rig_fork_restores_from_its_parents_snapshot_before_the_fork_point_only(storage: Storage) -> None:
    journal = await storage.open()
    session = await snapshot_rig(journal, 3).start_session()
    try:
        assert isinstance(await session.ask("go", timeout=10), TurnDone)
        await session.log.snapshots.wait()  # type: ignore[union-attr]
        settled = session.last_seq
        assert isinstance(await session.ask("again", timeout=10), TurnDone)
        await session.log.snapshots.wait()  # type: ignore[union-attr]
    finally:
        await session.shutdown()
    newest = await journal.load_snapshot(session.id, state_schema())
    assert newest is not None and newest.seq > settled  # the parent's newest is past the fork point
    fork = await snapshot_rig(journal, 1000).fork_session(session.id, settled)
    try:
        got = await restore_state(journal, fork.id)
        assert got.snapshot_seq <= settled
        assert got.state == (await restore_state(journal, fork.id, snapshots=False)).state
        assert fork.state.loops == got.state.loops and fork.state.loops["main"].turns == 1
    finally:
        await fork.shutdown()
