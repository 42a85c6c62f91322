"""Ledger artifacts on each backend: content-addressed (stored once), redacted before hashing, and pruned by the
retention setting on the store's (virtual) clock once every lane using them has been idle long enough."""

from __future__ import annotations

import asyncio

import pytest

from loopd._infra.clock import VirtualClock
from loopd.server.ledger import (
    MESSAGES_TYPE,
    REDACTED,
    Actor,
    ArtifactRetention,
    Lane,
    LaneRecorder,
    LedgerStore,
    NewEvent,
    Redactor,
    artifact_blob,
    parse_duration,
)
from loopd.server.storage import InvalidRecord, NotFound

DAY = 86400.0


async def _lane(ledger: LedgerStore, name: str) -> tuple[Lane, str]:
    actor = await ledger.ensure_actor(Actor(type="harness", key="builtin"))
    return await ledger.create_lane(Lane(session_id=name, run_id=name)), actor.id


async def _touch(ledger: LedgerStore, lane: Lane, actor: str) -> None:
    """An event on the lane now (it is in use)."""
    recorder = await LaneRecorder.open(ledger, lane.id)
    await recorder.append([NewEvent("lane.loopd.touched", lane.id, actor)])


async def test_identical_content_is_stored_once(ledger: LedgerStore) -> None:
    lane, _ = await _lane(ledger, "s1")
    blob = artifact_blob({"parent": None, "messages": [{"role": "user", "content": "hi"}]}, MESSAGES_TYPE)
    again = artifact_blob({"messages": [{"content": "hi", "role": "user"}], "parent": None}, MESSAGES_TYPE)
    assert blob.ref == again.ref and blob.ref.uri == f"ledger-artifact:sha256:{blob.ref.sha256}"
    await ledger.put_artifacts(lane.id, [blob, again])
    await ledger.put_artifacts(lane.id, [blob])
    stored = await ledger.get_artifact(blob.ref.sha256)
    assert stored.body == blob.body and stored.ref == blob.ref
    with pytest.raises(NotFound):
        await ledger.get_artifact("0" * 64)


def test_redaction_runs_before_hashing() -> None:
    redactor = Redactor([r"ACME-[0-9]{4}"], literals=["hunter2-the-password"])
    document = {
        "text": "key sk-abcdefghijklmnopqrstu and ACME-1234, "
        "Authorization: Bearer abcdefgh.ijk and hunter2-the-password",
        "password=opensesame": ["AKIAABCDEFGHIJKLMNOP", "ghp_abcdefghijklmnopqrstuvwxyz012345"],
        "token": "api_token: zzzzzzzzzz",
    }
    blob = artifact_blob(document, MESSAGES_TYPE, redactor)
    text = blob.body.decode()
    for secret in ("sk-abc", "ACME-1234", "abcdefgh.ijk", "hunter2", "opensesame", "AKIA", "ghp_", "zzzzzzzzzz"):
        assert secret not in text
    assert text.count(REDACTED) >= 7 and "Bearer [REDACTED]" in text
    assert blob.ref == artifact_blob(redactor.value(document), MESSAGES_TYPE).ref  # the hash is of redacted bytes
    assert redactor.text("plain words stay") == "plain words stay"
    with pytest.raises(ValueError, match="not a regular expression"):
        Redactor(["(unclosed"])


def test_durations() -> None:
    assert parse_duration("7d") == 7 * DAY and parse_duration("90") == 90 and parse_duration("12h") == 43200
    for bad in ("", "0d", "-1d", "7 days", "soon"):
        with pytest.raises(InvalidRecord):
            parse_duration(bad)


async def test_retention_prunes_what_only_idle_lanes_use(ledger: LedgerStore, clock: VirtualClock) -> None:
    old, actor = await _lane(ledger, "old")
    busy, _ = await _lane(ledger, "busy")
    shared = artifact_blob({"system": "shared prefix"}, MESSAGES_TYPE)
    mine = artifact_blob({"system": "only the old lane"}, MESSAGES_TYPE)
    theirs = artifact_blob({"system": "only the busy lane"}, MESSAGES_TYPE)
    await ledger.put_artifacts(old.id, [shared, mine])
    await ledger.put_artifacts(busy.id, [shared, theirs])
    await _touch(ledger, old, actor)
    await _touch(ledger, busy, actor)
    retention = ArtifactRetention(ledger, 7 * DAY, clock)
    assert await retention.sweep() == 0  # nothing is old yet

    await clock.advance(10 * DAY)
    await _touch(ledger, busy, actor)  # the busy lane goes on; the old one stays idle
    assert await retention.sweep() == 1
    with pytest.raises(NotFound):
        await ledger.get_artifact(mine.ref.sha256)
    assert (await ledger.get_artifact(shared.ref.sha256)).body == shared.body  # the busy lane still uses it
    assert (await ledger.get_artifact(theirs.ref.sha256)).body == theirs.body

    # The sweeper runs on its own every interval: 8 idle days later the rest goes without a manual sweep.
    task = asyncio.create_task(ArtifactRetention(ledger, 7 * DAY, clock, interval=DAY).run())
    try:
        await clock.advance(8 * DAY)
        for _ in range(200):
            try:
                await ledger.get_artifact(shared.ref.sha256)
            except NotFound:
                break
            await clock.advance(DAY)
        with pytest.raises(NotFound):
            await ledger.get_artifact(shared.ref.sha256)
        with pytest.raises(NotFound):
            await ledger.get_artifact(theirs.ref.sha256)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    with pytest.raises(ValueError):
        ArtifactRetention(ledger, 0, clock)
