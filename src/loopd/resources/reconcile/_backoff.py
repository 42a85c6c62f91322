"""Per-key exponential backoff.

Owns: the delay sequence after consecutive failures. Must not do: I/O, sleeping, or counting (the work queue
counts failures per key).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """``base * factor**(failures - 1)``, capped at ``max_delay``; no jitter, so tests are exact."""

    base: float = 0.05
    factor: float = 2.0
    max_delay: float = 300.0

    def __post_init__(self) -> None:
        if self.base <= 0 or self.factor < 1 or self.max_delay < self.base:
            raise ValueError("need base > 0, factor >= 1 and max_delay >= base")

    def delay(self, failures: int) -> float:
        """The wait before the next try after ``failures`` consecutive failures (``failures >= 1``)."""
        if failures < 1:
            return 0.0
        exponent = min(failures - 1, 1_000)  # past this the cap has long been reached; avoid overflow
        try:
            return min(self.max_delay, self.base * self.factor**exponent)
        except OverflowError:
            return self.max_delay
