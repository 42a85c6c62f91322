"""Stored timestamps: fixed-width UTC text that sorts like the instants and reads back to the same instant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopd.server.storage import InvalidRecord
from loopd.server.storage._values import parse_time, time_text

instants = st.datetimes(
    min_value=datetime(1, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=-7, minutes=-30)), timezone(timedelta(hours=14))]),
)


@given(instants, instants)
def test_stored_times_are_fixed_width_sort_like_the_instants_and_read_back(a: datetime, b: datetime) -> None:
    ta, tb = time_text(a), time_text(b)
    assert len(ta) == len(tb) == len("2026-12-02T12:00:00.000000Z")
    assert (ta < tb) == (a < b) and (ta == tb) == (a == b)
    back = parse_time(ta)
    assert back == a and back.utcoffset() == timedelta(0)


def test_naive_times_are_refused_and_foreign_text_is_not_read() -> None:
    with pytest.raises(InvalidRecord):
        time_text(datetime(2026, 12, 2))  # no timezone
    with pytest.raises(ValueError):
        parse_time("2026-12-02T12:00:00+01:00")


@given(instants)
def test_a_utc_time_is_written_as_any_other_instant_is(value: datetime) -> None:
    """The UTC fast path (remembered texts) and the general one agree, microseconds of 0 included."""
    for instant in (value, value.replace(microsecond=0)):
        utc = instant.astimezone(UTC)
        expected = utc.isoformat(timespec="microseconds").removesuffix("+00:00") + "Z"
        assert time_text(utc) == time_text(utc) == expected  # the second from the cache
        assert time_text(utc.astimezone(timezone(timedelta(hours=3)))) == expected
