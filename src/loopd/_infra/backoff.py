"""Retry delays: one exponential backoff with full jitter and a cap.

Owns: the delay before retry *n* after consecutive failures, and a small per-loop counter with reset.
Must not do: I/O, sleeping (the caller sleeps on its ``Clock``) or deciding *whether* to retry.

Delay for retry ``n`` (0-based: the wait after the first failure is retry 0)::

    ceiling(n) = min(max_delay, base * factor**n)
    delay(n)   = ceiling(n) * (1 - jitter + jitter * u),  u uniform in [0, 1)

``jitter=1`` is full jitter (uniform in ``[0, ceiling)``, AWS's recommendation against retry storms);
``jitter=0`` is the plain exponential sequence. Callers inject ``random`` so tests are exact.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable
from dataclasses import dataclass, field

Random = Callable[[], float]
"""A source of floats uniform in [0, 1), like ``random.random``."""

_MAX_EXPONENT = 1_000  # past this the cap has long been reached; avoid overflow


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter and a cap (see the module docstring)."""

    base: float = 0.05
    factor: float = 2.0
    max_delay: float = 300.0
    jitter: float = 1.0
    random: Random = field(default=_random.random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.base <= 0 or self.factor < 1 or self.max_delay < self.base:
            raise ValueError("need base > 0, factor >= 1 and max_delay >= base")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("jitter must be within [0, 1]")

    def ceiling(self, retry: int) -> float:
        """The largest delay retry number ``retry`` (0-based) may wait."""
        if retry < 0:
            return 0.0
        try:
            return min(self.max_delay, self.base * self.factor ** min(retry, _MAX_EXPONENT))
        except OverflowError:
            return self.max_delay

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (0-based), jittered."""
        ceiling = self.ceiling(retry)
        if self.jitter == 0.0:
            return ceiling
        fraction = min(max(self.random(), 0.0), 1.0)
        return ceiling * (1.0 - self.jitter + self.jitter * fraction)

    def after_failures(self, failures: int) -> float:
        """The wait after ``failures`` consecutive failures (0 when nothing failed)."""
        return self.delay(failures - 1) if failures >= 1 else 0.0

    def attempts(self) -> Attempts:
        """A fresh failure counter for one retry loop."""
        return Attempts(self)


class Attempts:
    """Consecutive failures of one retry loop: ``failed()`` returns the next wait, ``reset()`` after a success."""

    __slots__ = ("_backoff", "failures")

    def __init__(self, backoff: Backoff) -> None:
        self._backoff = backoff
        self.failures = 0

    def failed(self) -> float:
        """Count one more failure; the delay to wait before trying again."""
        self.failures += 1
        return self._backoff.after_failures(self.failures)

    def reset(self) -> None:
        """A success: the next failure starts from the base delay again."""
        self.failures = 0
