"""Property tests: random append sequences on the SQL ledger (a temporary SQLite database), and canonical JSON."""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopd.server.ledger import Actor as LedgerActor
from loopd.server.ledger import (
    AppendReceipt,
    IdempotencyViolation,
    Lane,
    LaneConflict,
    NewEvent,
    SqlLedgerStore,
    batch_digest,
)
from loopd.server.storage import Database, DatabaseOptions, InvalidRecord, canonical_json

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)

# One step: ("new", batch size, seq skew) appends fresh events with expected_last_seq = head + skew;
# ("replay", index, mutate) re-sends an earlier append id with the same (or changed) events.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("new"), st.integers(1, 3), st.sampled_from([0, 0, 0, -1, 1])),
        st.tuples(st.just("replay"), st.integers(0, 20), st.booleans()),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(steps=steps, payloads=st.lists(json_values, min_size=1, max_size=5))
def test_random_append_sequences_keep_seqs_contiguous_and_replays_idempotent(
    steps: list[tuple[str, int, Any]], payloads: list[Any]
) -> None:
    async def scenario() -> None:
        with tempfile.TemporaryDirectory() as folder:
            database = await Database.open(
                str(Path(folder) / "ledger.db"), options=DatabaseOptions(operation_timeout=30.0)
            )
            try:
                await run(SqlLedgerStore(database))
            finally:
                await database.aclose()

    async def run(store: SqlLedgerStore) -> None:
        actor = await store.create_actor(LedgerActor(type="system"))
        lane = await store.create_lane(Lane(session_id="s", run_id="r"))
        head = 0
        sent: list[tuple[str, list[NewEvent], AppendReceipt]] = []
        for number, step in enumerate(steps):
            if step[0] == "new":
                _, size, skew = step
                events = [
                    NewEvent("lane.test.fact", lane.id, actor.id, payload={"v": payloads[(number + i) % len(payloads)]})
                    for i in range(size)
                ]
                expected = head + skew
                if expected < 0:
                    continue
                append_id = f"append-{number}"
                if skew != 0:
                    with pytest.raises(LaneConflict) as conflict:
                        await store.append(lane.id, expected, append_id, events)
                    assert conflict.value.actual == head
                    continue
                receipt = await store.append(lane.id, expected, append_id, events)
                assert (receipt.first_seq, receipt.last_seq) == (head + 1, head + size)
                assert receipt.digest == batch_digest(events)
                head = receipt.last_seq
                sent.append((append_id, events, receipt))
            elif sent:
                _, index, mutate = step
                append_id, events, receipt = sent[index % len(sent)]
                if mutate:
                    changed = [dataclasses.replace(events[0], payload={"v": "changed", "w": events[0].payload})]
                    with pytest.raises(IdempotencyViolation):
                        await store.append(lane.id, head, append_id, changed + events[1:])
                else:
                    copies = [dataclasses.replace(event) for event in events]
                    assert await store.append(lane.id, head, append_id, copies) == receipt
        stored = await store.load_lane(lane.id)
        assert [event.seq for event in stored] == list(range(1, head + 1))
        assert [event.id for event in stored] == [i for _, _, receipt in sent for i in receipt.event_ids]
        assert (await store.get_lane(lane.id)).last_seq == head

    asyncio.run(scenario())


@given(st.dictionaries(st.text(max_size=6), json_values, max_size=6))
def test_canonical_json_ignores_key_order(value: dict[str, Any]) -> None:
    reordered = dict(reversed(list(value.items())))
    assert canonical_json(value) == canonical_json(reordered)
    assert b" " not in canonical_json({"a": [1, 2], "b": None})


def test_canonical_json_writes_integral_floats_as_integers_and_refuses_nan() -> None:
    assert canonical_json({"b": 1.0, "a": "é"}) == '{"a":"é","b":1}'.encode()
    assert canonical_json([0.5, 2**53 + 0.0]) == b"[0.5,9007199254740992.0]"
    with pytest.raises(InvalidRecord):
        canonical_json(float("nan"))
