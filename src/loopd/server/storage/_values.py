"""How values are stored: UTC timestamps as fixed-width text, JSON as compact text, canonical JSON digests.

Owns: the text form of timestamps (``2025-01-02T03:04:05.000006Z``, which sorts like the instant it names on both
backends), compact JSON, canonical JSON and its SHA-256 digest, the ``UNSET`` marker for partial updates and the
paging-limit rule. Must not do: I/O.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import math
import threading
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from loopd._infra.ids import uuid7_int, uuid_text
from loopd._infra.jsontext import compact
from loopd._infra.jsontext import loads as json_loads

from ._errors import InvalidRecord

MAX_PAGE: Final = 1000
"""The largest ``limit`` any list call accepts."""
MAX_SECONDS: Final = 10 * 366 * 24 * 3600
"""The longest duration (ten years) accepted for a timeout, deadline or lease: anything longer is unbounded."""


class Unset(enum.Enum):
    """The type of ``UNSET``: "leave this field as it is" in a partial update (``None`` is a real value)."""

    UNSET = 0


UNSET: Final = Unset.UNSET


class MonotonicIds:
    """UUIDv7 strings that strictly increase for one ``Database``, even within one millisecond.

    ``loopd._infra.ids.uuid7`` fills the bits after the millisecond at random, so two ids of the same millisecond sort
    randomly; messages page by id, so this source bumps an id that would not sort after the previous one.
    """

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def __call__(self) -> str:
        value = uuid7_int()
        with self._lock:
            if value <= self._last:
                value = self._last + 1  # stays inside the random bits: the version and variant fields are kept
            self._last = value
        return uuid_text(value)  # `str(uuid.UUID(int=value))`, without building one


def time_text(value: datetime) -> str:
    """A timezone-aware instant as fixed-width UTC text (naive datetimes are refused)."""
    if value.__class__ is datetime and value.tzinfo is UTC:  # what the clocks make (most calls): one lookup
        return _utc_text(value)
    if not isinstance(value, datetime):
        raise InvalidRecord(f"expected a datetime, not {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidRecord(f"timestamp {value!r} has no timezone")
    return _utc_text(value if value.tzinfo is UTC else value.astimezone(UTC))


@functools.lru_cache(maxsize=1024)
def _utc_text(value: datetime) -> str:
    """`time_text` of a UTC datetime, remembered: a ledger event's time is written three times (its digest, its
    check, its row), a transaction's "now" often more."""
    # isoformat ("...+00:00") is faster than strftime and zero-pads every year (strftime's %Y does not below 1000);
    # without ``timespec`` a third faster again, but it leaves out microseconds that are 0.
    text = value.isoformat()
    return f"{text[:-6]}Z" if value.microsecond else f"{text[:-6]}.000000Z"


def parse_time(text: str) -> datetime:
    """The stored fixed-width UTC text back to a datetime (``fromisoformat`` is ~10x faster than ``strptime``)."""
    if not text.endswith("Z"):
        raise ValueError(f"not a stored UTC time: {text!r}")
    return datetime.fromisoformat(text)  # Python 3.11 reads the trailing Z as UTC


def optional_time(text: str | None) -> datetime | None:
    return None if text is None else parse_time(text)


def seconds(value: float, what: str) -> timedelta:
    """A positive, finite duration in seconds, or ``InvalidRecord``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise InvalidRecord(f"{what} must be a positive, finite number of seconds, not {value!r}")
    if value > MAX_SECONDS:
        raise InvalidRecord(f"{what} must be at most {MAX_SECONDS} seconds, not {value!r}")
    return timedelta(seconds=value)


def dumps(value: Any) -> str:
    """Compact JSON text (UTF-8, no whitespace); ``InvalidRecord`` for values JSON cannot hold."""
    try:
        return compact(value)
    except (TypeError, ValueError) as exc:
        raise InvalidRecord(f"value is not JSON: {exc}") from exc


def loads(text: str | None) -> Any:
    return None if text is None else json_loads(text)


def _normalize(value: Any) -> Any:
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:  # most leaves: nothing to do, decided fast
        return value
    if kind is dict:
        return {key if type(key) is str else str(key): _normalize(item) for key, item in value.items()}
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {str(k): _normalize(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalize(v) for v in value]
    return value


def canonical_json(value: Any) -> bytes:
    """Canonical JSON bytes: object keys sorted, no whitespace, UTF-8, integral floats written as integers.

    This approximates RFC 8785 (JCS) without implementing it fully: keys sort by Unicode code point rather than
    UTF-16 code unit (they differ only between astral characters and U+E000..U+FFFF), and non-integral floats use
    Python's shortest round-trip form, whose exponent spelling (``1e-07``) differs from ECMAScript's (``1e-7``).
    Digests are therefore stable within loopd but not guaranteed equal to another JCS implementation's.
    """
    try:
        text = compact(_normalize(value), sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise InvalidRecord(f"value is not JSON: {exc}") from exc
    return text.encode("utf-8")


def digest(value: Any) -> str:
    """``sha256:<hex>`` of ``canonical_json(value)``."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def page_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidRecord(f"limit must be an integer from 1 to {MAX_PAGE}, not {limit!r}")
    return limit


def require_text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRecord(f"{what} must be a non-empty string")
    return value


def require_choice(value: Any, allowed: frozenset[str], what: str) -> str:
    if value not in allowed:
        raise InvalidRecord(f"{what} must be one of {', '.join(sorted(repr(a) for a in allowed))}, not {value!r}")
    return str(value)


def require_object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRecord(f"{what} must be a JSON object")
    return value
