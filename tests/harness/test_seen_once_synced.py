"""Seen only once stored: on a journal that defers syncs (SQLite at FULL), a loop step whose next effects are safe to
run again commits without waiting for the disk, and nobody sees its events until a sync covers them.

`SessionLog` is driven over a writer whose syncs the test releases by hand (`_HeldSyncs`); a real `SqliteJournal`
at FULL then runs whole turns through a `Rig`: read-only tools and model calls go on while the disk works, a tool
with effects runs only once everything before it is synced, and what subscribers see is gap-free and complete.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from loopd._infra.clock import SystemClock
from loopd.harness import (
    EchoTool,
    Idempotency,
    LoopDefinition,
    MemoryJournal,
    Reply,
    Rig,
    ScriptedModel,
    SessionFaultError,
    SqliteJournal,
)
from loopd.harness.actors import Envelope
from loopd.harness.actors._loop import LoopActor
from loopd.harness.actors._session_log import MAX_UNSEEN, SessionLog
from loopd.harness.core import ToolCall
from loopd.harness.core.events import InputQueued, TokenDelta, TurnDone
from loopd.harness.core.inputs import ArmGate, CallModel, Compact, RunTools
from loopd.harness.foreign import ForeignEngine
from loopd.harness.journal import JournalWriter, NewRecord
from loopd.harness.tools import PreparedCall, ToolContext, ToolResult

from .helpers import collect_until


class _HeldSyncs:
    """A writer over a memory journal's that defers syncs: each `sync` waits until the test calls `release`."""

    def __init__(self, inner: JournalWriter) -> None:
        self._inner = inner
        self.unsynced_appends = 0
        self.synced_appends = 0
        self.syncs = 0
        self._gate = asyncio.Event()
        self.fail: Exception | None = None

    @property
    def session_id(self) -> str:
        return self._inner.session_id

    @property
    def last_seq(self) -> int:
        return self._inner.last_seq

    @property
    def defers_sync(self) -> bool:
        return True

    async def append(self, records: Sequence[NewRecord], *, sync: bool = True) -> list[int]:
        if sync:
            self.synced_appends += 1
        else:
            self.unsynced_appends += 1
        return await self._inner.append(records)

    async def sync(self) -> None:
        await self._gate.wait()
        self._gate.clear()
        if self.fail is not None:
            raise self.fail
        self.syncs += 1

    def release(self) -> None:
        self._gate.set()

    async def aclose(self) -> None:
        await self._inner.aclose()


def queued(i: int) -> InputQueued:
    return InputQueued(loop="main", command_id=f"c{i}", text=str(i))


def token(text: str) -> TokenDelta:
    return TokenDelta(loop="main", turn_id="main/1", step=1, text=text)


async def open_log() -> tuple[SessionLog, _HeldSyncs, list[SessionFaultError]]:
    journal = MemoryJournal()
    writer = _HeldSyncs(await journal.create_session("s", at=0.0))
    faults: list[SessionFaultError] = []
    return SessionLog("s", journal, writer, clock=SystemClock(), on_fault=faults.append), writer, faults


async def take(sub: object, n: int) -> list[Envelope]:
    async with asyncio.timeout(5):
        return [await sub.__anext__() for _ in range(n)]  # type: ignore[attr-defined]


def publisher(log: SessionLog, event: InputQueued) -> Callable[[list[int]], None]:
    return lambda seqs: log.publish(seqs[0], event)


async def test_a_lazy_commit_is_applied_at_once_but_seen_only_once_synced() -> None:
    log, writer, _ = await open_log()
    sub = log.subscribe()
    applied: list[list[int]] = []

    def apply(seqs: list[int]) -> None:
        applied.append(seqs)
        log.publish(seqs[0], queued(1))

    assert await log.commit((queued(1),), apply, wait=False) == [1]
    assert applied == [[1]] and writer.unsynced_appends == 1
    log.publish(None, token("after"))  # an ephemeral event after it waits behind it: the order holds
    assert log.last_seq == 1 and log.synced_seq == 0
    with pytest.raises(TimeoutError):  # nothing seen yet
        await asyncio.wait_for(sub.__anext__(), 0.05)
    writer.release()
    got = await take(sub, 2)
    assert [(e.seq, e.event.kind) for e in got] == [(1, "input_queued"), (None, "token_delta")]
    assert log.synced_seq == 1 and writer.syncs == 1
    await log.aclose()


async def test_a_waited_commit_syncs_and_lets_everything_before_it_be_seen_first() -> None:
    log, writer, _ = await open_log()
    sub = log.subscribe()
    await log.commit((queued(1),), publisher(log, queued(1)), wait=False)
    log.publish(None, token("between"))
    await log.commit((queued(2),), publisher(log, queued(2)))  # wait=True: a synced append
    assert writer.synced_appends == 1 and log.synced_seq == 2
    got = await take(sub, 3)
    assert [e.seq for e in got] == [1, None, 2]
    writer.release()  # the syncer's own sync, no longer needed for anything
    await log.aclose()


async def test_lazy_commits_gather_behind_one_sync() -> None:
    log, writer, _ = await open_log()
    sub = log.subscribe()
    for i in range(1, 6):
        await log.commit((queued(i),), publisher(log, queued(i)), wait=False)
    writer.release()
    got = await take(sub, 5)
    assert [e.seq for e in got] == [1, 2, 3, 4, 5]
    assert writer.syncs == 1  # the syncer's window gathered them
    await log.aclose()


async def test_a_failed_sync_faults_the_log_and_ends_its_subscriptions() -> None:
    log, writer, faults = await open_log()
    sub = log.subscribe()
    await log.commit((queued(1),), publisher(log, queued(1)), wait=False)
    writer.fail = OSError(5, "Input/output error")
    writer.release()
    with pytest.raises(SessionFaultError, match="journal sync failed"):
        await take(sub, 1)  # the unsynced event is never seen
    assert len(faults) == 1 and log.fault is faults[0]
    with pytest.raises(SessionFaultError):
        await log.commit((queued(2),), publisher(log, queued(2)))
    await log.aclose()


async def test_closing_syncs_what_is_left_so_subscribers_see_the_end() -> None:
    log, writer, _ = await open_log()
    sub = log.subscribe()
    await log.commit((queued(1),), publisher(log, queued(1)), wait=False)
    closing = asyncio.ensure_future(log.aclose())
    await asyncio.sleep(0.01)
    writer.release()
    writer.release()
    await asyncio.wait_for(closing, 5)
    assert [e.seq async for e in sub] == [1]


async def test_a_catch_up_reaches_only_the_last_synced_seq_and_goes_on_live() -> None:
    log, writer, _ = await open_log()
    await log.commit((queued(1),), publisher(log, queued(1)))
    await log.commit((queued(2),), publisher(log, queued(2)), wait=False)
    sub = log.subscribe(from_seq=1)
    got = await take(sub, 1)
    assert [e.seq for e in got] == [1]
    writer.release()
    assert [e.seq for e in await take(sub, 1)] == [2]
    await log.aclose()


async def test_too_many_unseen_envelopes_make_the_next_commit_wait_and_drop_ephemera() -> None:
    log, writer, _ = await open_log()
    await log.commit((queued(1),), publisher(log, queued(1)), wait=False)
    for i in range(MAX_UNSEEN + 5):
        log.publish(None, token(str(i)))
    assert log.unseen_dropped == 6  # the lazy commit's envelope and MAX_UNSEEN - 1 tokens wait; the rest are dropped
    await log.commit((queued(2),), publisher(log, queued(2)), wait=False)
    assert writer.synced_appends == 1  # over the bound: synced, not deferred
    assert log.synced_seq == 2
    writer.release()
    await log.aclose()


# --- whole turns on a real journal at FULL ---------------------------------------------------------------------


class _Witness(EchoTool):
    """A tool with effects (``Idempotency.NONE``) that notes whether the journal still held unsynced commits when
    it ran: it must not run before the records leading to it are on the disk."""

    def __init__(self, journal: SqliteJournal) -> None:
        super().__init__("touch_remote", idempotency=Idempotency.NONE)
        self._journal = journal
        self.unsynced_when_run: list[bool] = []

    async def run(self, call: PreparedCall, ctx: ToolContext) -> ToolResult:
        self.unsynced_when_run.append(self._journal.unsynced)
        return await super().run(call, ctx)


async def test_at_full_read_only_steps_go_on_while_the_disk_works_and_others_wait_for_it(tmp_path: Path) -> None:
    journal = await SqliteJournal.open(tmp_path / "journal.db", synchronous="FULL")
    witness = _Witness(journal)
    steps = [Reply(tool_calls=[("echo", {"text": f"r{i}"})]) for i in range(6)]
    steps += [Reply(tool_calls=[("touch_remote", {"text": "w"})]), Reply(text="done")]
    model = ScriptedModel(steps)
    rig = Rig(
        loops=[LoopDefinition(name="main", model=model, tools=(EchoTool(), witness), max_steps=20)],
        journal=journal,
    )
    try:
        session = await rig.start_session()
        sub = session.subscribe(from_seq=1)
        end = await session.ask("go", timeout=30)
        assert isinstance(end, TurnDone)
        seen = await collect_until(sub, {"turn_done"})
        seqs = [e.seq for e in seen if e.seq is not None]
        assert seqs == list(range(1, len(seqs) + 1))  # gap-free, in order
        assert journal.commits_unsynced >= 6  # the read-only steps did not wait for their fdatasync
        assert witness.unsynced_when_run == [False]  # the tool with effects ran only once all before it was synced
        await session.shutdown()
        stored = await journal.read(session.id)
        assert [r.seq for r in stored] == list(range(1, len(stored) + 1))
        assert not journal.unsynced
    finally:
        await journal.aclose()


# --- which effects may start before the disk has their records ---------------------------------------------------


def _actor_for(definition: LoopDefinition) -> LoopActor:
    """`LoopActor._repeatable` reads only the loop's definition: an actor object with just that, not started."""
    actor = LoopActor.__new__(LoopActor)
    actor.definition = definition
    return actor


def _call(name: str) -> ToolCall:
    return ToolCall(id=f"call-{name}", name=name, arguments={"text": "x"})


def test_only_model_calls_and_inherently_repeatable_tools_may_start_before_the_sync() -> None:
    tools = (
        EchoTool("read", idempotency=Idempotency.INHERENT),
        EchoTool("keyed", idempotency=Idempotency.KEYED),
        EchoTool("write", idempotency=Idempotency.NONE),
    )
    actor = _actor_for(LoopDefinition(name="main", model=ScriptedModel([]), tools=tools))
    model = CallModel(turn_id="main/1", step=1, messages=())
    assert actor._repeatable((model,))
    assert actor._repeatable((RunTools(turn_id="main/1", step=1, calls=(_call("read"), _call("read"))),))
    assert actor._repeatable((RunTools(turn_id="main/1", step=1, calls=(_call("read"),), gated=False), model))
    for name in ("keyed", "write", "unknown"):  # a new model call would bring a KEYED call back with a new key
        assert not actor._repeatable((RunTools(turn_id="main/1", step=1, calls=(_call("read"), _call(name))),))
    assert not actor._repeatable(())  # a turn's end, a partial batch: seen only once synced, so wait for it
    assert not actor._repeatable((ArmGate(turn_id="main/1", step=1, gate_id="g", deadline=1.0),))
    assert not actor._repeatable((model, Compact(turn_id="main/1", step=1, messages=())))
    foreign = _actor_for(LoopDefinition(name="main", model=ForeignEngine(kind="claude")))
    assert not foreign._repeatable((model,))  # a foreign CLI's turn runs its own tools
