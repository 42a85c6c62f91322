"""The one backoff: exponential, jittered, capped, resettable, exact with an injected random source."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopd._infra.backoff import Backoff


def test_without_jitter_the_sequence_is_exponential_and_capped() -> None:
    backoff = Backoff(base=0.5, factor=3.0, max_delay=10.0, jitter=0)
    assert [backoff.after_failures(n) for n in range(1, 6)] == [0.5, 1.5, 4.5, 10.0, 10.0]
    assert backoff.after_failures(10_000) == 10.0
    assert backoff.after_failures(0) == 0.0
    assert [backoff.delay(n) for n in range(3)] == [0.5, 1.5, 4.5]


def test_full_jitter_scales_the_ceiling_by_the_random_fraction() -> None:
    backoff = Backoff(base=1.0, factor=2.0, max_delay=5.0, random=lambda: 0.5)
    assert [backoff.delay(n) for n in range(4)] == [0.5, 1.0, 2.0, 2.5]
    assert Backoff(base=1.0, random=lambda: 0.0).delay(3) == 0.0


def test_partial_jitter_keeps_a_floor() -> None:
    backoff = Backoff(base=4.0, factor=2.0, max_delay=100.0, jitter=0.5, random=lambda: 0.0)
    assert backoff.delay(0) == 2.0
    assert backoff.delay(1) == 4.0


def test_attempts_count_failures_and_reset_after_a_success() -> None:
    attempts = Backoff(base=1.0, factor=2.0, max_delay=8.0, jitter=0).attempts()
    assert [attempts.failed() for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    attempts.reset()
    assert attempts.failures == 0
    assert attempts.failed() == 1.0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="base"):
        Backoff(base=0)
    with pytest.raises(ValueError, match="factor"):
        Backoff(factor=0.5)
    with pytest.raises(ValueError, match="jitter"):
        Backoff(jitter=1.5)


@given(
    retry=st.integers(-3, 5_000),
    fraction=st.floats(0, 1, exclude_max=True),
    jitter=st.floats(0, 1),
)
def test_a_delay_stays_within_its_bounds(retry: int, fraction: float, jitter: float) -> None:
    backoff = Backoff(base=0.5, factor=2, max_delay=8, jitter=jitter, random=lambda: fraction)
    delay = backoff.delay(retry)
    ceiling = backoff.ceiling(retry)
    assert 0 <= delay <= ceiling <= 8
    assert delay >= ceiling * (1 - jitter) - 1e-9
