"""Wake-ups for readers of a conversation's durable event log.

The log in the database is the truth; the bus only tells waiting readers "something was committed, read again".
A reader that reads and waits in turn listens from before its read (`ConversationBus.listen`): a notice that comes
while it reads ends its next wait at once. One that misses a wake-up anyway (a notice lost with a reconnecting
listener) still finds the events on its next read, because waits are bounded (on the bus's ``Clock``) and every
wait is followed by a read. Memory is bounded by the number of conversations with a listening or waiting reader.

Across replicas: ``notify`` publishes the key on the bus's `Notifier` (channel `BUS_CHANNEL`), whose handler
wakes the waiting readers — here at once, and on every other process sharing the notifier's backend (PostgreSQL
LISTEN/NOTIFY) soon after. A ``None`` notice (the listener reconnected: notices may be lost) wakes every reader.
Without a notifier the bus makes its own `MemoryNotifier` (one process).

Hand-over: a writer of this process that knows exactly which events its commit stored calls `committed` instead of
``notify``. The notice goes out as usual, and this process's followers of the conversation (`follow`: the live
feed, one per conversation) are handed the stored events with it, so they need not read them back. Every other
notice reaches a follower as ``None`` ("read the log"). With the events comes the header of each message whose
``start`` or ``end`` the commit stored (the message as that commit left it), so those need no read either. A
hand-over is only a shortcut: the follower checks that the events continue where it is (cursors are consecutive
per conversation) and reads the log otherwise.

The hand-overs also tell which answers show nothing yet (`FirstOutputs`, ``bus.first_outputs``): a response whose
``start`` this process committed, until one of its events shows something.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from loopd._infra.clock import Clock, SystemClock, wait_event, wait_first
from loopd._infra.notify import MemoryNotifier, Notifier
from loopd.agentue import AgentUEError, StreamState
from loopd.server.storage import Message, MessageEvent

_log = logging.getLogger(__name__)

BUS_CHANNEL: Final = "conversations"
"""The notifier channel a bus publishes its keys on (conversation ids, call channels)."""

Headers = Mapping[str, Message]
"""Message id → the message as a commit left it (the header of its ``start`` / ``end`` event)."""
_NO_HEADERS: Final[Headers] = {}

Follower = Callable[[Sequence[MessageEvent] | None, Headers], None]
"""Called on the event loop after each notice of the followed key: with the events this process's own commit stored
(`ConversationBus.committed`), else ``None`` (read the log). It must be quick and must not raise."""


@dataclass
class _Slot:
    event: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: int = 0


class BusListener:
    """A reader's subscription to one key (`ConversationBus.listen`)."""

    def __init__(self, clock: Clock, slot: _Slot) -> None:
        self._clock = clock
        self._slot = slot
        self._event = slot.event  # set by the first notice after this point

    async def wait(self, timeout: float, *, stop: asyncio.Event | None = None) -> bool:
        """Wait for a notice since the previous wait returned, at most ``timeout`` seconds (``stop``, when set,
        ends it early); whether one came."""
        event = self._event
        try:
            if event.is_set():
                return True
            if stop is None:
                return await wait_event(self._clock, event, timeout)
            if stop.is_set():
                return False
            waiters = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(stop.wait())]
            try:
                await wait_first(self._clock, waiters, timeout)
            finally:
                for waiter in waiters:
                    waiter.cancel()
                await asyncio.gather(*waiters, return_exceptions=True)
            return event.is_set()
        finally:
            # Notices so far are covered by the caller's next read; the next wait is for later ones.
            self._event = self._slot.event


HEADS_LIMIT: Final = 10_000
"""At most this many conversations' last cursors are remembered (`ConversationBus.head`; the oldest go first)."""
FIRST_OUTPUT_YIELD: Final = 0.5
"""How long a writer that has just shown an answer's first output lets the answers that show nothing yet go first:
long enough for a burst of 100 chats to all show text (≈ 400 ms here); a shorter one ends mid-burst."""
FIRST_OUTPUT_HORIZON: Final = 10.0
"""An answer that has shown nothing this long (its writer is elsewhere, or slow) is no longer waited for."""
FIRST_OUTPUT_LIMIT: Final = 10_000
"""At most this many answers are remembered (the oldest are forgotten first)."""


COMMITTED_STATES_LIMIT: Final = 256
"""At most this many messages' committed stream states are kept (`CommittedStates`; the oldest go first). A state is
an answer's whole content: the bound keeps what outlives its drive small; one evicted before its message's end only
makes that end read the row, as it did without the registry."""


class CommittedStates:
    """The stream states this process's writers committed, by message id and the revision that commit gave the
    message: a later writer of the message in this process (the end of a harness call's answer, written by the Task's
    completion) starts from one instead of reading the message's last seq and decoding its content again.

    A state answers only at the exact revision it was committed at: every write of a message moves its revision, so a
    write by anyone else (another replica, a rolled-back or possibly-committed transaction never put here) makes it
    answer None. Bounded (`COMMITTED_STATES_LIMIT`, least recently put first out); `take` removes what it answers."""

    __slots__ = ("_limit", "_states")

    def __init__(self, limit: int = COMMITTED_STATES_LIMIT) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self._limit = limit
        self._states: OrderedDict[str, tuple[int, StreamState]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def put(self, message_id: str, revision: int, state: StreamState) -> None:
        """``state`` is what message ``message_id`` holds at ``revision``, committed."""
        states = self._states
        states[message_id] = (revision, state)
        states.move_to_end(message_id)
        if len(states) > self._limit:
            states.popitem(last=False)

    def get(self, message_id: str, revision: int) -> StreamState | None:
        """The state of message ``message_id`` at ``revision``, if a commit of this process left it there."""
        found = self._states.get(message_id)
        return found[1] if found is not None and found[0] == revision else None

    def take(self, message_id: str, revision: int) -> StreamState | None:
        """`get`, and forget the message (its last writer takes it: nothing is kept for a message that ended)."""
        found = self._states.pop(message_id, None)
        return found[1] if found is not None and found[0] == revision else None

    def forget(self, message_id: str) -> None:
        """Keep nothing for ``message_id`` (at any revision)."""
        self._states.pop(message_id, None)


class FirstOutputs:
    """The answers (response messages) this process started that show nothing yet, for writers to go easy on the
    rest of an answer while other answers have not shown a word.

    A harness call whose first text a durable update follows at once (a fast harness: the rest of its turn, its
    end) writes the text alone, then waits — at most `FIRST_OUTPUT_YIELD` — until no other answer is still blank
    (`yield_to_blank`), then writes the rest. Under a burst of chats the event loop then spends itself on the answers
    nobody has seen a word of before it ends the ones that already show text: the last chats' time to first text
    drops, the work is the same plus one small write per call. Learned from `ConversationBus.committed`: a response's
    ``start`` adds it, any later event of it (text, a tool call, a question, its end) removes it. Bounded in size
    and age (`FIRST_OUTPUT_LIMIT`, `FIRST_OUTPUT_HORIZON`): an answer written by another replica is forgotten."""

    __slots__ = ("_blank", "_clock", "_none", "_opened")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._blank: OrderedDict[str, float] = OrderedDict()  # message id → when its start was committed
        # the stream state of each blank answer as its opening commit left it, at that commit's revision
        self._opened = CommittedStates(FIRST_OUTPUT_LIMIT)
        self._none = asyncio.Event()
        self._none.set()

    def __len__(self) -> int:
        self._expire()
        return len(self._blank)

    def started(self, message_id: str, opened: Message | None = None, seq: int = 1) -> None:
        """``message_id`` shows nothing yet; ``opened``: the message as the commit of its ``start`` (number ``seq``)
        left it, which `opened_state` answers for while it stays blank."""
        self._expire()
        if len(self._blank) >= FIRST_OUTPUT_LIMIT:
            forgotten, _ = self._blank.popitem(last=False)
            self._opened.forget(forgotten)
        self._blank[message_id] = self._clock.monotonic()
        if opened is not None:
            try:
                self._opened.put(message_id, opened.revision, StreamState.of(opened.content, seq=seq))
            except AgentUEError:  # stored checked, so never; its writer reads the row as usual then
                _log.warning("answer %s: its opening content does not parse", message_id, exc_info=True)
        self._none.clear()

    def opened_state(self, message_id: str, revision: int) -> StreamState | None:
        """The stream state of a blank answer at ``revision`` as its opening commit left it (its content, the seq of
        its ``start``), or None: not known here, or written since (every write moves the revision). Its first
        writer then folds onto it without reading the row and its last seq back."""
        return self._opened.get(message_id, revision)

    def shown(self, message_id: str) -> None:
        self._opened.forget(message_id)
        if self._blank.pop(message_id, None) is not None and not self._blank:
            self._none.set()

    def others_blank(self, message_id: str) -> bool:
        """Whether an answer other than ``message_id`` shows nothing yet."""
        self._expire()
        return len(self._blank) > (message_id in self._blank)

    async def yield_to_blank(self) -> None:
        """Wait until no answer is blank, at most `FIRST_OUTPUT_YIELD` seconds."""
        await wait_event(self._clock, self._none, FIRST_OUTPUT_YIELD)

    def _expire(self) -> None:
        blank = self._blank
        if not blank:
            return
        horizon = self._clock.monotonic() - FIRST_OUTPUT_HORIZON
        while blank and next(iter(blank.values())) < horizon:
            forgotten, _ = blank.popitem(last=False)
            self._opened.forget(forgotten)
        if not blank:
            self._none.set()

    def note(self, events: Sequence[MessageEvent], headers: Headers) -> None:
        """What a commit stored (see `ConversationBus.committed`)."""
        blank = self._blank
        for event in events:
            message_id = event.message_id
            if event.event.get("op") == "start":
                header = headers.get(message_id)
                if header is not None and header.purpose == "response" and header.status == "streaming":
                    self.started(message_id, header, event.seq)
            elif blank and message_id in blank:
                self.shown(message_id)


class ConversationBus:
    """Wakes readers waiting on a key, on every replica sharing the notifier (see the module docstring)."""

    def __init__(self, *, clock: Clock | None = None, notifier: Notifier | None = None) -> None:
        self._slots: dict[str, _Slot] = {}
        self._followers: dict[str, list[Follower]] = {}
        self._handing: tuple[str, Sequence[MessageEvent], Headers] | None = None  # only while `committed` publishes
        # conversation id → the last cursor its notices told of, while every notice of it since came with its events
        self._heads: OrderedDict[str, int] = OrderedDict()
        self._clock = clock or SystemClock()  # bounded waits (the readers' polls) are measured on it
        self.first_outputs = FirstOutputs(self._clock)
        self.states = CommittedStates()
        self._notifier: Notifier = notifier if notifier is not None else MemoryNotifier()
        self._unsubscribe = self._notifier.subscribe(BUS_CHANNEL, self._on_notice)

    def notify(self, conversation_id: str) -> None:
        """Wake every reader waiting on ``conversation_id``, on every replica (call after the commit)."""
        self._notifier.publish(BUS_CHANNEL, conversation_id)

    def committed(self, conversation_id: str, events: Sequence[MessageEvent], headers: Headers = _NO_HEADERS) -> None:
        """`notify`, and hand ``events`` to this process's followers of ``conversation_id`` (see the module
        docstring). Call after the commit that stored exactly ``events`` (in cursor order) for the conversation;
        ``headers``: the messages whose ``start`` / ``end`` it stored, as it left them."""
        self.first_outputs.note(events, headers)
        self._handing = (conversation_id, events, headers)
        try:
            self.notify(conversation_id)
        finally:
            self._handing = None

    def follow(self, conversation_id: str, follower: Follower) -> Callable[[], None]:
        """Call ``follower`` after every notice of ``conversation_id`` from now on; returns the function that stops
        it. The notifier calls this process's handlers at once, so a hand-over reaches the follower inside
        `committed`; a notifier that did not would only make followers read the log."""
        followers = self._followers.setdefault(conversation_id, [])
        followers.append(follower)

        def stop() -> None:
            with contextlib.suppress(ValueError):
                followers.remove(follower)
            if not followers and self._followers.get(conversation_id) is followers:
                del self._followers[conversation_id]

        return stop

    def head(self, conversation_id: str) -> int | None:
        """The conversation's last committed cursor as far as this process can tell without reading: set by the
        hand-overs of its own commits, forgotten at any notice that came without events (another replica's or
        another writer's commit, a reconnect), so a feed that starts at this very cursor and follows from now on
        misses nothing by not reading first. None: not known here."""
        return self._heads.get(conversation_id)

    def _note_head(self, key: str, events: Sequence[MessageEvent] | None) -> None:
        heads = self._heads
        if not events:
            heads.pop(key, None)
            return
        last = events[-1].cursor
        known = heads.get(key)
        if known is not None and known >= last:
            return  # a commit's hand-over that runs after a later one's: the later cursor stands
        heads[key] = last
        heads.move_to_end(key)
        if len(heads) > HEADS_LIMIT:
            heads.popitem(last=False)

    def _on_notice(self, key: str | None) -> None:
        if key is None:  # anything may have changed: every reader reads again
            self._heads.clear()
            for each in tuple(self._slots.values()):
                self._set(each)
            for followers in tuple(self._followers.values()):
                self._tell(followers, None, _NO_HEADERS)
            return
        handing = self._handing
        handed = handing[1] if handing is not None and handing[0] == key else None
        self._note_head(key, handed)
        following = self._followers.get(key)
        if following:
            if handing is not None and handed is not None:
                self._tell(following, handed, handing[2])
            else:
                self._tell(following, None, _NO_HEADERS)
        found = self._slots.get(key)
        if found is not None:
            self._set(found)

    @staticmethod
    def _tell(followers: list[Follower], events: Sequence[MessageEvent] | None, headers: Headers) -> None:
        for follower in tuple(followers):
            try:
                follower(events, headers)
            except Exception:  # one faulty follower must not stop the notice reaching the others
                _log.exception("a conversation follower failed")

    @staticmethod
    def _set(slot: _Slot) -> None:
        slot.event.set()
        slot.event = asyncio.Event()

    def close(self) -> None:
        """Stop taking notices (readers still wake at their bounded polls)."""
        self._unsubscribe()

    @property
    def notifier(self) -> Notifier:
        """The notifier this bus publishes on (the engine announces its calls on it too)."""
        return self._notifier

    async def wait(self, conversation_id: str, timeout: float, *, stop: asyncio.Event | None = None) -> bool:
        """Wait for the next notify of ``conversation_id``, at most ``timeout`` seconds; whether it came.

        ``stop`` (e.g. a server's shutdown signal), when set, ends the wait early as well. A reader that reads
        and then waits should `listen` instead: a notice that comes while it reads is not lost then.
        """
        with self.listen(conversation_id) as listener:
            return await listener.wait(timeout, stop=stop)

    @contextlib.contextmanager
    def listen(self, conversation_id: str) -> Iterator[BusListener]:
        """Notices of ``conversation_id`` from now on, for a reader that reads and waits in turn: each
        `BusListener.wait` returns at once when a notice came since the previous one returned (or since `listen`),
        so one that arrives while the reader reads is not slept through."""
        slot = self._slots.setdefault(conversation_id, _Slot())
        slot.waiters += 1
        try:
            yield BusListener(self._clock, slot)
        finally:
            slot.waiters -= 1
            if slot.waiters == 0 and self._slots.get(conversation_id) is slot:
                del self._slots[conversation_id]

    @property
    def clock(self) -> Clock:
        """The clock bounded waits are measured on (the streams' heartbeats and the feeds' polls use it too)."""
        return self._clock

    @property
    def watched(self) -> int:
        """Keys with a waiting reader or a follower."""
        if not self._followers:
            return len(self._slots)
        return len(self._slots.keys() | self._followers.keys())
