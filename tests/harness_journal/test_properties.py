"""Property: whatever batches are appended, reading back gives exactly them, under contiguous seqs from 1."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopd.harness.journal import Journal, MemoryJournal, NewRecord, SqliteJournal

new_records = st.builds(
    NewRecord,
    kind=st.text(min_size=1, max_size=12),
    version=st.integers(0, 2**31 - 1),
    data=st.binary(max_size=64),
    at=st.floats(allow_nan=False, allow_infinity=False, width=64),
)
# (session index, batch): appends spread over up to three sessions, in any order.
appends = st.lists(st.tuples(st.integers(0, 2), st.lists(new_records, max_size=6)), max_size=20)
windows = st.lists(st.tuples(st.integers(-1, 40), st.none() | st.integers(0, 40)), max_size=5)


async def check(journal: Journal, plan: list[tuple[int, list[NewRecord]]], reads: list[tuple[int, int | None]]) -> None:
    names = ["a", "b", "c"]
    writers = [await journal.create_session(name, at=float(i)) for i, name in enumerate(names)]
    expected: dict[str, list[NewRecord]] = {name: [] for name in names}
    for index, batch in plan:
        name = names[index]
        seqs = await writers[index].append(batch)
        assert seqs == list(range(len(expected[name]) + 1, len(expected[name]) + len(batch) + 1))
        expected[name].extend(batch)
    for name, wanted in expected.items():
        stored = await journal.read(name)
        assert [r.seq for r in stored] == list(range(1, len(wanted) + 1))
        assert [NewRecord(r.kind, r.version, r.data, r.at) for r in stored] == wanted
        for from_seq, limit in reads:
            start = max(from_seq, 1) - 1
            window = stored[start:] if limit is None else stored[start : start + limit]
            assert await journal.read(name, from_seq, limit) == window
        info = await journal.session(name)
        assert info is not None and info.last_seq == len(wanted)


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=appends, reads=windows)
def test_read_back_equals_what_was_appended(
    backend: str, plan: list[tuple[int, list[NewRecord]]], reads: list[tuple[int, int | None]]
) -> None:
    async def scenario() -> None:
        if backend == "memory":
            await check(MemoryJournal(), plan, reads)
            return
        with tempfile.TemporaryDirectory() as folder:
            journal = await SqliteJournal.open(Path(folder) / "journal.db")
            try:
                await check(journal, plan, reads)
            finally:
                await journal.aclose()

    asyncio.run(scenario())
