"""`loads`: JSON text read back from storage, decoded with msgspec where it can and the standard library otherwise.

Stored rows (messages, their events, harness calls, resource bodies) are decoded on every read: with the standard
library that is ≈ 1.7 µs for a two-key object and ≈ 5.7 µs for a 2.9 kB message content, with msgspec ≈ 0.15 and
≈ 2.2 µs. What msgspec refuses and the standard library takes — ``NaN`` / ``Infinity``, numbers beyond a float's
range, lone surrogate escapes — is decoded by the standard library (the same value and the same errors as before);
for everything else both give equal values, integers of any size included (orjson, for one, reads an integer
beyond 64 bits as a float: not used here). Encoding stays with the standard library (its ``allow_nan=False`` and
key checks are what writers rely on).
Must not do: decode anything that is not JSON text (bytes are UTF-8, as the standard library's ``json.loads`` takes).
"""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec

__all__ = ["loads"]

_DECODER: Final = msgspec.json.Decoder()


def loads(text: str | bytes | bytearray) -> Any:
    """The value of the JSON document ``text`` (``json.JSONDecodeError`` / ``ValueError`` when it is not one)."""
    try:
        return _DECODER.decode(text)
    except msgspec.DecodeError:  # not JSON, or JSON only the standard library reads (see the module docstring)
        return json.loads(text)
