"""`loads`: JSON text read back from storage, decoded with msgspec where it can and the standard library otherwise;
`compact`: compact JSON text, exactly as the standard library writes it, without its per-call set-up.

Stored rows (messages, their events, harness calls, resource bodies) are decoded on every read: with the standard
library that is ≈ 1.7 µs for a two-key object and ≈ 5.7 µs for a 2.9 kB message content, with msgspec ≈ 0.15 and
≈ 2.2 µs. What msgspec refuses and the standard library takes — ``NaN`` / ``Infinity``, numbers beyond a float's
range, lone surrogate escapes — is decoded by the standard library (the same value and the same errors as before);
for everything else both give equal values, integers of any size included (orjson, for one, reads an integer
beyond 64 bits as a float: not used here).

Encoding stays with the standard library — its ``allow_nan=False`` refusal, its key checks and its float spelling are
what writers and stored digests rely on (msgspec writes NaN as ``null`` and ``1e-07`` as ``1e-7``) — but `compact`
keeps one C encoder per key order instead of building a `json.JSONEncoder` and its C encoder on every call, as
``json.dumps`` with options does (≈ 2.0 → 0.6 µs for a two-key object, ≈ 5.9 → 3.9 µs for a 1 kB event). The text is
the C encoder's, byte for byte what ``json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)``
gives (`compact_lenient`: the same with ``allow_nan=True``, the default); it skips only the circular-reference
bookkeeping (a value that contains itself fails as too deep instead).
Must not do: decode anything that is not JSON text (bytes are UTF-8, as the standard library's ``json.loads`` takes).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, Final

import msgspec

__all__ = ["compact", "compact_lenient", "loads"]

_DECODER: Final = msgspec.json.Decoder()


def _encoder(sort_keys: bool, allow_nan: bool = False) -> Callable[[Any], str]:
    if c_make_encoder is None:  # a Python without the C accelerator: the standard library's own path
        return lambda value: json.dumps(
            value, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False, allow_nan=allow_nan
        )
    # The arguments `json.JSONEncoder.iterencode` passes; no markers: no circular-reference bookkeeping to reset.
    encode = c_make_encoder(
        None, json.JSONEncoder().default, encode_basestring, None, ":", ",", sort_keys, False, allow_nan
    )

    def compact(value: Any) -> str:
        try:
            return "".join(encode(value, 0))
        except RecursionError as exc:
            raise ValueError("the value is nested too deeply (or contains itself) to be JSON") from exc

    return compact


_COMPACT: Final = _encoder(sort_keys=False)
_SORTED: Final = _encoder(sort_keys=True)
_LENIENT: Final = _encoder(sort_keys=False, allow_nan=True)


def compact(value: Any, *, sort_keys: bool = False) -> str:
    """``value`` as compact JSON text: no whitespace, UTF-8 as is, NaN and Infinity refused (``ValueError``), and
    ``TypeError`` for what JSON cannot hold — what ``json.dumps`` with those options gives (module docstring)."""
    return _SORTED(value) if sort_keys else _COMPACT(value)


def compact_lenient(value: Any) -> str:
    """`compact` that writes NaN and Infinity as ``NaN`` / ``Infinity``, as ``json.dumps`` does by default: for text
    that was written that way before (frames, resource bodies), where refusing them now would break a reader."""
    return _LENIENT(value)


def loads(text: str | bytes | bytearray) -> Any:
    """The value of the JSON document ``text`` (``json.JSONDecodeError`` / ``ValueError`` when it is not one)."""
    try:
        return _DECODER.decode(text)
    except msgspec.DecodeError:  # not JSON, or JSON only the standard library reads (see the module docstring)
        return json.loads(text)
