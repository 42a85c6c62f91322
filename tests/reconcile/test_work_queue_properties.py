"""Property: whatever the interleaving of adds, gets and dones, a key is never handed out twice at once, and
every add is followed by a hand-out of that key (no wake-up is lost)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from loopd.resources.reconcile import VirtualClock, WorkQueue

KEYS = st.sampled_from(["a", "b", "c"])
OPERATIONS = st.lists(
    st.one_of(st.tuples(st.just("add"), KEYS), st.tuples(st.just("get"), st.none()), st.tuples(st.just("done"), KEYS)),
    max_size=60,
)


async def scenario(operations: list[tuple[str, str | None]]) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=VirtualClock())
    processing: set[str] = set()
    owed: set[str] = set()  # keys added since they were last handed out

    async def hand_out() -> None:
        key = await queue.get()
        assert key not in processing, f"{key} handed out while processing"
        processing.add(key)
        owed.discard(key)

    for operation, key in operations:
        if operation == "add" and key is not None:
            queue.add(key)
            owed.add(key)
        elif operation == "get" and queue.statistics().depth:
            await hand_out()
        elif operation == "done" and key in processing:
            processing.discard(key)
            queue.done(key)
    # Finish everything in flight, then drain: every owed key must come out.
    for key in sorted(processing):
        processing.discard(key)
        queue.done(key)
    while queue.statistics().depth:
        await hand_out()
        for key in sorted(processing):
            processing.discard(key)
            queue.done(key)
    assert owed == set(), f"lost wake-ups: {owed}"
    assert queue.statistics().depth == 0
    await queue.aclose()


@settings(max_examples=300, deadline=None)
@given(OPERATIONS)
def test_no_key_is_processed_concurrently_and_no_add_is_lost(operations: list[tuple[str, str | None]]) -> None:
    asyncio.run(scenario(operations))
