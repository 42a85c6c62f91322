"""Hub semantics: filters, bounded queues, overflow, subscribe from a journal seq."""

from __future__ import annotations

import asyncio

import pytest

from loopd.harness import Journal, Lifecycle, LoopDefinition, Reply, Rig, ScriptedModel, SubscriptionLostError
from loopd.harness.actors import Envelope, Hub
from loopd.harness.actors._hub import RECENT
from loopd.harness.core.events import InputQueued, TokenDelta

from .helpers import collect_until


def token(i: int) -> Envelope:
    return Envelope("s", None, TokenDelta(loop="main", turn_id="main/1", step=1, text=str(i)))


def enduring(seq: int) -> Envelope:
    return Envelope("s", seq, InputQueued(loop="main", command_id=f"c{seq}", text="x"))


async def test_ephemeral_overflow_is_dropped_without_blocking() -> None:
    hub = Hub("s")
    sub = hub.subscribe(maxsize=4)
    for i in range(10):
        hub.publish(token(i))  # never blocks, never raises
    hub.publish(enduring(1))  # room? no: the queue is full of ephemera → subscription lost
    got = [await sub.__anext__() for _ in range(4)]
    assert [e.event.text for e in got] == ["0", "1", "2", "3"]  # type: ignore[union-attr]
    assert sub.dropped == 6
    with pytest.raises(SubscriptionLostError) as info:
        await sub.__anext__()
    assert info.value.last_seq == 0


async def test_enduring_overflow_ends_only_that_subscription() -> None:
    hub = Hub("s")
    slow = hub.subscribe(maxsize=256)
    fast = hub.subscribe(maxsize=1024)
    for seq in range(1, 258):
        hub.publish(enduring(seq))  # the 257th enduring event overflows `slow`
    delivered = [await slow.__anext__() for _ in range(256)]
    assert delivered[-1].seq == 256
    with pytest.raises(SubscriptionLostError) as info:
        await slow.__anext__()
    assert info.value.last_seq == 256
    assert hub.subscriber_count == 1
    assert [(await fast.__anext__()).seq for _ in range(257)] == list(range(1, 258))


async def test_filters_by_lifecycle_loop_and_kind() -> None:
    hub = Hub("s")
    only_enduring = hub.subscribe(lifecycles={Lifecycle.ENDURING})
    other_loop = hub.subscribe(loops={"other"})
    hub.publish(token(1))
    hub.publish(enduring(1))
    hub.close()
    assert [e.seq async for e in only_enduring] == [1]
    assert [e async for e in other_loop] == []


def chatty_rig(journal: Journal) -> Rig:
    model = ScriptedModel([], default=Reply(text="word " * 20, chunk_size=5))
    return Rig(loops=[LoopDefinition(name="main", model=model)], journal=journal)


async def test_subscribe_from_seq_catches_up_then_goes_live_without_gaps(journal: Journal) -> None:
    session = await chatty_rig(journal).start_session()
    for i in range(5):
        await session.ask(f"q{i}", timeout=30)
    head = session.last_seq
    sub = session.subscribe(from_seq=2, lifecycles={Lifecycle.ENDURING, Lifecycle.TERMINAL})
    seen: list[int] = []
    async with asyncio.timeout(30):
        async for env in sub:
            assert env.seq is not None
            seen.append(env.seq)
            if env.seq == head:
                break
    # Now live: new turns continue the same sequence.
    await session.submit("live one")
    more = await collect_until(sub, {"turn_done"})
    seen += [e.seq for e in more if e.seq is not None]
    assert seen == list(range(2, seen[-1] + 1))
    await session.shutdown()


async def test_resubscribe_after_loss_resumes_exactly(journal: Journal) -> None:
    session = await chatty_rig(journal).start_session()
    sub = session.subscribe(maxsize=2, lifecycles={Lifecycle.ENDURING, Lifecycle.TERMINAL})
    for i in range(3):
        await session.ask(f"q{i}", timeout=30)
    seen: list[int] = []
    with pytest.raises(SubscriptionLostError) as info:
        async for env in sub:
            assert env.seq is not None
            seen.append(env.seq)
    resumed = session.subscribe(from_seq=info.value.last_seq + 1, lifecycles={Lifecycle.ENDURING, Lifecycle.TERMINAL})
    await session.shutdown()
    seen += [e.seq async for e in resumed if e.seq is not None]
    assert seen == list(range(seen[0], session.last_seq + 1))


async def test_subscribe_from_seq_survives_live_overflow_during_catch_up(journal: Journal) -> None:
    session = await chatty_rig(journal).start_session()
    for i in range(20):
        await session.ask(f"q{i}", timeout=30)
    sub = session.subscribe(from_seq=1, maxsize=3, lifecycles={Lifecycle.ENDURING, Lifecycle.TERMINAL})
    first = await sub.__anext__()
    assert first.seq == 1
    for i in range(3):  # live enduring events overflow the tiny queue while it is still catching up
        await session.ask(f"live{i}", timeout=30)
    await session.shutdown()
    rest = [e.seq async for e in sub]
    assert [1, *rest] == list(range(1, session.last_seq + 1))


async def test_a_stopped_session_can_still_be_read_from_a_seq(journal: Journal) -> None:
    session = await chatty_rig(journal).start_session()
    await session.ask("q", timeout=30)
    await session.shutdown()
    sub = session.subscribe(from_seq=1)
    kinds = [e.event.kind async for e in sub]
    assert kinds[0] == "session_started" and kinds[-1] == "session_stopped"


class CountingReader:
    """A journal reader over published envelopes that counts its reads."""

    def __init__(self) -> None:
        self.stored: list[Envelope] = []
        self.reads = 0

    async def __call__(self, from_seq: int, limit: int) -> list[Envelope]:
        self.reads += 1
        return [e for e in self.stored if e.seq is not None and e.seq >= from_seq][:limit]


def published_hub(count: int) -> tuple[Hub, CountingReader]:
    reader = CountingReader()
    hub = Hub("s", reader)
    for seq in range(1, count + 1):
        reader.stored.append(enduring(seq))
        hub.publish(enduring(seq))
    return hub, reader


async def test_a_catch_up_the_recent_events_cover_reads_no_journal() -> None:
    """From a seq the hub's recent envelopes hold (up to the last committed one): served from them, then live;
    from past the last committed seq: live at once. Either way the same events as from the journal."""
    hub, reader = published_hub(10)
    sub = hub.subscribe(from_seq=4, committed=10)
    ahead = hub.subscribe(from_seq=11, committed=10)
    hub.publish(enduring(11))
    hub.close()
    assert [e.seq async for e in sub] == list(range(4, 12))
    assert [e.seq async for e in ahead] == [11]
    assert reader.reads == 0


async def test_a_catch_up_beyond_the_recent_events_or_without_the_last_commit_reads_the_journal() -> None:
    hub, reader = published_hub(RECENT + 10)
    old = hub.subscribe(from_seq=5, committed=RECENT + 10)  # before the oldest kept
    reader.stored.append(enduring(RECENT + 11))  # committed, not published yet
    unpublished = hub.subscribe(from_seq=RECENT + 5, committed=RECENT + 11)
    hub.publish(enduring(RECENT + 11))
    hub.close()
    assert [e.seq async for e in old] == list(range(5, RECENT + 12))
    assert [e.seq async for e in unpublished] == list(range(RECENT + 5, RECENT + 12))
    assert reader.reads >= 2


async def test_a_live_overflow_during_a_catch_up_from_memory_resyncs_from_the_journal() -> None:
    hub, reader = published_hub(20)
    sub = hub.subscribe(from_seq=1, committed=20, maxsize=3)
    assert (await sub.__anext__()).seq == 1
    for seq in range(21, 26):  # overflow the tiny live queue while it still catches up
        reader.stored.append(enduring(seq))
        hub.publish(enduring(seq))
    hub.close()
    assert [1, *[e.seq async for e in sub]] == list(range(1, 26))
    assert reader.reads >= 1


async def test_the_engine_style_subscription_of_a_new_session_reads_no_journal(journal: Journal) -> None:
    """A session just started, subscribed from seq 1 (what the engine's run does): no journal read."""
    session = await chatty_rig(journal).start_session()
    reads = 0
    original = journal.read

    async def counting(*args: object, **kwargs: object) -> object:
        nonlocal reads
        reads += 1
        return await original(*args, **kwargs)  # type: ignore[arg-type]

    journal.read = counting  # type: ignore[method-assign]
    try:
        sub = session.subscribe(from_seq=1, lifecycles={Lifecycle.ENDURING, Lifecycle.TERMINAL})
        await session.submit("q")
        got = await collect_until(sub, {"turn_done"})
    finally:
        journal.read = original  # type: ignore[method-assign]
    assert got[0].event.kind == "session_started"
    assert [e.seq for e in got] == list(range(1, got[-1].seq + 1))  # type: ignore[operator]
    assert reads == 0
    await session.shutdown()
