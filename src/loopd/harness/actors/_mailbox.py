"""A loop's mailbox: three lanes read in priority order.

* priority — Interrupt / Shutdown / stop; small and bounded; read first so an interrupt never waits behind
  queued work;
* results — completed effects; bounded by construction (at most one model call plus one tool batch in flight);
* commands — user inputs; bounded (``capacity``); `put` waits for room up to a deadline (back-pressure).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

from loopd.harness._errors import MailboxFullError

T = TypeVar("T")


class Mailbox(Generic[T]):
    def __init__(self, capacity: int = 64, priority_capacity: int = 16) -> None:
        if capacity < 1 or priority_capacity < 1:
            raise ValueError("mailbox capacities must be positive")
        self._capacity = capacity
        self._priority_capacity = priority_capacity
        self._priority: deque[T] = deque()
        self._results: deque[T] = deque()
        self._commands: deque[T] = deque()
        self._readable = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    def __len__(self) -> int:
        return len(self._priority) + len(self._results) + len(self._commands)

    def put_priority(self, item: T) -> None:
        if len(self._priority) >= self._priority_capacity:
            raise MailboxFullError("priority lane is full")
        self._priority.append(item)
        self._readable.set()

    def put_result(self, item: T) -> None:
        self._results.append(item)
        self._readable.set()

    def put_nowait(self, item: T) -> None:
        if len(self._commands) >= self._capacity:
            raise MailboxFullError(f"mailbox is full ({self._capacity} commands waiting)")
        self._commands.append(item)
        if len(self._commands) >= self._capacity:
            self._room.clear()
        self._readable.set()

    async def put(self, item: T, *, timeout: float) -> None:
        """Queue a command, waiting up to ``timeout`` seconds for room."""
        try:
            async with asyncio.timeout(timeout):
                while len(self._commands) >= self._capacity:
                    await self._room.wait()
        except TimeoutError as exc:
            raise MailboxFullError(f"mailbox stayed full for {timeout:g}s") from exc
        self.put_nowait(item)

    async def get(self) -> T:
        while True:
            if self._priority:
                return self._priority.popleft()
            if self._results:
                return self._results.popleft()
            if self._commands:
                item = self._commands.popleft()
                self._room.set()
                return item
            self._readable.clear()
            await self._readable.wait()

    def drain_commands(self) -> list[T]:
        items = list(self._commands)
        self._commands.clear()
        self._room.set()
        return items
