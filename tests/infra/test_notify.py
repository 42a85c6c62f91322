"""The notifier contract (``loopd._infra.notify``), run against the in-memory notifier and against PostgreSQL
LISTEN/NOTIFY (two notifiers on one database act as two replicas), plus what only PostgreSQL has: reconnecting
the listener and the sender, and the bounded send queue."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import psycopg
import pytest

from loopd._infra.notify import (
    MAX_PAYLOAD,
    MemoryNotifier,
    Notifier,
    NotifyError,
    PostgresNotifier,
    open_notifier,
)
from tests.support.postgres import postgres_dsn, postgres_server  # noqa: F401
from tests.support.waiting import eventually

Pair = tuple[Notifier, Notifier]
"""(publisher, subscriber): two replicas' notifiers (one shared instance in memory)."""


class Heard:
    """What one handler received, in order."""

    def __init__(self) -> None:
        self.payloads: list[str | None] = []

    def __call__(self, payload: str | None) -> None:
        self.payloads.append(payload)

    @property
    def notices(self) -> list[str]:
        """The payloads, without the ``None`` a (re)connecting listener sends."""
        return [payload for payload in self.payloads if payload is not None]


async def _open_postgres(dsn: str, **options: object) -> PostgresNotifier:
    notifier = await PostgresNotifier.open(dsn, timeout=5.0, **options)  # type: ignore[arg-type]
    assert await notifier.listening(10.0)
    return notifier


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    if request.param == "memory":
        async with MemoryNotifier() as memory:
            yield memory, memory
        return
    dsn = str(request.getfixturevalue("postgres_dsn"))
    first = await _open_postgres(dsn)
    try:
        second = await _open_postgres(dsn)
        try:
            yield first, second
        finally:
            await second.aclose()
    finally:
        await first.aclose()


async def heard(handler: Heard, count: int, what: str = "the notices") -> None:
    await eventually(lambda: len(handler.notices) >= count, timeout=10.0, what=what)


# --- the contract ------------------------------------------------------------------------------------------------


async def test_a_subscriber_hears_what_another_replica_publishes(pair: Pair) -> None:
    publisher, subscriber = pair
    handler = Heard()
    subscriber.subscribe("conversations", handler)
    publisher.publish("conversations", "conv-1")
    await heard(handler, 1)
    assert handler.notices == ["conv-1"]


async def test_the_publishing_replica_hears_itself_at_once(pair: Pair) -> None:
    publisher, _ = pair
    handler = Heard()
    publisher.subscribe("conversations", handler)
    publisher.publish("conversations", "conv-1")
    assert handler.notices == ["conv-1"]  # before any await: the local subscribers are called inside publish


async def test_channels_are_separate_and_an_unsubscribed_handler_hears_nothing(pair: Pair) -> None:
    publisher, subscriber = pair
    calls, gone, sentinel = Heard(), Heard(), Heard()
    subscriber.subscribe("harness-calls", calls)
    stop = subscriber.subscribe("conversations", gone)
    stop()
    stop()  # twice is harmless
    subscriber.subscribe("conversations", sentinel)
    publisher.publish("conversations", "conv-1")
    await heard(sentinel, 1)
    assert calls.notices == [] and gone.payloads == []
    publisher.publish("harness-calls", "call-1")
    await heard(calls, 1)
    assert calls.notices == ["call-1"] and sentinel.notices == ["conv-1"]


async def test_every_distinct_notice_arrives(pair: Pair) -> None:
    publisher, subscriber = pair
    handler = Heard()
    subscriber.subscribe("conversations", handler)
    sent = [f"conv-{index}" for index in range(300)]  # more than one send batch
    for payload in sent:
        publisher.publish("conversations", payload)
    await heard(handler, len(sent))
    assert sorted(handler.notices) == sorted(sent)


async def test_a_failing_handler_does_not_stop_the_others(pair: Pair, caplog: pytest.LogCaptureFixture) -> None:
    publisher, subscriber = pair

    def broken(_payload: str | None) -> None:
        raise RuntimeError("boom")

    handler = Heard()
    subscriber.subscribe("conversations", broken)
    subscriber.subscribe("conversations", handler)
    publisher.publish("conversations", "conv-1")
    await heard(handler, 1)
    assert "failed" in caplog.text


@pytest.mark.parametrize(
    ("channel", "payload"),
    [("", "x"), ("two words", "x"), ("c" * 65, "x"), ("ok", "x" * (MAX_PAYLOAD + 1)), ("ok", "nul\x00")],
)
async def test_bad_channels_and_payloads_are_refused(pair: Pair, channel: str, payload: str) -> None:
    publisher, subscriber = pair
    with pytest.raises(NotifyError):
        publisher.publish(channel, payload)
    if channel != "ok":
        with pytest.raises(NotifyError):
            subscriber.subscribe(channel, Heard())


# --- PostgreSQL only ---------------------------------------------------------------------------------------------


def _terminate(dsn: str, query_prefix: str) -> int:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'loopd-notifier' AND query LIKE %s AND pid <> pg_backend_pid()",
            (query_prefix + "%",),
        ).fetchall()
    return len(rows)


@pytest.fixture
async def notifiers(postgres_dsn: str) -> AsyncIterator[Callable[..., Awaitable[PostgresNotifier]]]:  # noqa: F811
    opened: list[PostgresNotifier] = []

    async def factory(**options: object) -> PostgresNotifier:
        notifier = await _open_postgres(postgres_dsn, **options)
        opened.append(notifier)
        return notifier

    try:
        yield factory
    finally:
        for notifier in opened:
            await notifier.aclose()


@pytest.mark.postgres
async def test_a_listener_that_lost_its_connection_reconnects_and_says_anything_may_have_changed(
    postgres_dsn: str,  # noqa: F811
    notifiers: Callable[..., Awaitable[PostgresNotifier]],
) -> None:
    publisher, subscriber = await notifiers(), await notifiers()
    handler = Heard()
    subscriber.subscribe("conversations", handler)
    assert _terminate(postgres_dsn, "LISTEN") >= 1
    await eventually(lambda: None in handler.payloads, timeout=15.0, what="the reconnect's 'anything changed'")
    assert subscriber.statistics().listens >= 2
    publisher.publish("conversations", "after-reconnect")
    await heard(handler, 1)
    assert handler.notices == ["after-reconnect"]


@pytest.mark.postgres
async def test_a_sender_that_lost_its_connection_sends_again(
    postgres_dsn: str,  # noqa: F811
    notifiers: Callable[..., Awaitable[PostgresNotifier]],
) -> None:
    publisher, subscriber = await notifiers(), await notifiers()
    handler = Heard()
    subscriber.subscribe("conversations", handler)
    publisher.publish("conversations", "first")
    await heard(handler, 1)
    assert _terminate(postgres_dsn, "SELECT pg_notify") >= 1  # the sender's pooled connection
    publisher.publish("conversations", "second")
    await heard(handler, 2, "the notice sent after the sender's connection broke")
    assert handler.notices == ["first", "second"]


@pytest.mark.postgres
async def test_notices_published_just_before_close_still_go_out(
    notifiers: Callable[..., Awaitable[PostgresNotifier]],
) -> None:
    publisher, subscriber = await notifiers(), await notifiers()
    handler = Heard()
    subscriber.subscribe("harness-calls", handler)
    publisher.publish("harness-calls", "released")  # what an engine says as it closes
    await publisher.aclose()
    await heard(handler, 1)
    assert handler.notices == ["released"]
    publisher.publish("harness-calls", "after-close")  # closed: this process's handlers only, nothing sent
    assert publisher.statistics().sent == 1


@pytest.mark.postgres
async def test_an_overflowing_queue_collapses_into_anything_changed(
    notifiers: Callable[..., Awaitable[PostgresNotifier]],
) -> None:
    publisher, subscriber = await notifiers(max_pending=3), await notifiers()
    handler = Heard()
    subscriber.subscribe("conversations", handler)
    before = len(handler.payloads)
    for index in range(10):  # no await in between: the sender cannot run, the queue fills
        publisher.publish("conversations", f"conv-{index}")
    await eventually(lambda: None in handler.payloads[before:], timeout=10.0, what="the collapsed notice")
    assert publisher.statistics().collapsed >= 1
    assert len(handler.payloads) - before <= 3  # bounded: never the ten notices


async def test_open_notifier_picks_the_backend_by_url(tmp_path: Path) -> None:
    async with open_notifier(str(tmp_path / "loopd.db")) as notifier:
        assert isinstance(notifier, MemoryNotifier)
    async with open_notifier(None) as notifier:
        assert isinstance(notifier, MemoryNotifier)


@pytest.mark.postgres
async def test_open_notifier_on_a_postgres_dsn(postgres_dsn: str) -> None:  # noqa: F811
    async with open_notifier(postgres_dsn, timeout=5.0) as notifier:
        assert isinstance(notifier, PostgresNotifier)
        assert await notifier.listening(10.0)
