"""Wake-ups for readers of a conversation's durable event log.

The log in the database is the truth; the bus only tells waiting readers "something was committed, read again".
A reader that misses a wake-up (another replica wrote, or it was not waiting yet) still finds the events on its
next read, because waits are bounded (`wait(..., timeout)`) and every wait is followed by a read. Memory is
bounded by the number of conversations with a waiting reader.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class _Slot:
    event: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: int = 0


class ConversationBus:
    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}

    def notify(self, conversation_id: str) -> None:
        """Wake every reader waiting on ``conversation_id`` (call after the commit)."""
        slot = self._slots.get(conversation_id)
        if slot is not None:
            slot.event.set()
            slot.event = asyncio.Event()

    async def wait(self, conversation_id: str, timeout: float) -> bool:
        """Wait for the next notify of ``conversation_id``, at most ``timeout`` seconds; whether it came."""
        slot = self._slots.setdefault(conversation_id, _Slot())
        event = slot.event
        slot.waiters += 1
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
            return True
        except TimeoutError:
            return False
        finally:
            slot.waiters -= 1
            if slot.waiters == 0 and self._slots.get(conversation_id) is slot:
                del self._slots[conversation_id]

    @property
    def watched(self) -> int:
        return len(self._slots)
