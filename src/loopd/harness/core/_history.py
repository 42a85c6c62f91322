"""`History`: an immutable sequence of messages with O(1) amortized append.

Every `History` value sees a fixed prefix of a shared buffer. Appending to the newest value extends the shared
buffer in place (no older value can observe it: each reads only its own prefix); appending to an older value
copies its prefix first. So `apply` stays pure while a fold over n events costs O(n), not O(n²).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, overload

from pydantic import GetCoreSchemaHandler
from pydantic_core import CoreSchema, core_schema

from loopd.harness.core._values import Message


class History(Sequence[Message]):
    __slots__ = ("_buf", "_n")

    _buf: list[Message]
    _n: int

    def __init__(self, items: Iterable[Message] = ()) -> None:
        self._buf = list(items)
        self._n = len(self._buf)

    def appended(self, *messages: Message) -> History:
        buf = self._buf if self._n == len(self._buf) else self._buf[: self._n]
        buf.extend(messages)
        new = History.__new__(History)
        new._buf = buf
        new._n = len(buf)
        return new

    def extends(self, prefix: History) -> bool:
        """Whether this history starts with the very messages of ``prefix`` (it is ``prefix`` or was appended to
        from it), in O(1): both see the same buffer, whose first items never change. False does not mean they
        differ (an equal history built apart is not recognised). State snapshots re-encode only what was added."""
        return self._buf is prefix._buf and self._n >= prefix._n

    def as_tuple(self) -> tuple[Message, ...]:
        return tuple(self._buf[: self._n])

    def tail(self, start: int) -> list[Message]:
        """The messages from index ``start`` on, in O(len - start): what a reader that has the first ``start``
        (this history `extends` the one it saw) still needs."""
        return self._buf[max(start, 0) : self._n]

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Message, ...]: ...

    def __getitem__(self, index: int | slice) -> Message | tuple[Message, ...]:
        if isinstance(index, slice):
            return self.as_tuple()[index]
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("history index out of range")
        return self._buf[index]

    def __iter__(self) -> Iterator[Message]:
        return islice(self._buf, self._n)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, History):
            return self._n == other._n and (self._buf is other._buf or self._buf[: self._n] == other._buf[: other._n])
        if isinstance(other, tuple):
            return self.as_tuple() == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.as_tuple())

    def __repr__(self) -> str:
        return f"History({self.as_tuple()!r})"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        """How pydantic reads and writes a `History` (state snapshots, `loopd.harness.core.snapshot`): as the
        list of its messages."""
        messages = handler.generate_schema(tuple[Message, ...])
        return core_schema.no_info_after_validator_function(
            History,
            messages,
            serialization=core_schema.plain_serializer_function_ser_schema(History.as_tuple, return_schema=messages),
        )


EMPTY_HISTORY = History()
