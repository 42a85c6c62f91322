"""The hub: fans a session's events out to subscribers without ever blocking the publisher.

Each subscriber has a filter and a bounded queue (default 256). On overflow an ephemeral event is dropped (and
counted); an enduring event ends only that subscription with `SubscriptionLostError` carrying the last seq it
delivered, so the subscriber can resubscribe from the next seq. A subscription may start *from a journal seq*:
it first catches up from the journal page by page, then switches to live events with no gap and no duplicate
(live events at or below the catch-up cursor are skipped).

The hub keeps the last `RECENT` committed envelopes it published. A subscription from a seq they cover (up to the
last committed one) catches up from them, with no journal read; one from past the last committed seq starts live.
The engine's run of a new session subscribes from seq 1 just after the session started: before, that was a journal
read and decode per call.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Literal

from loopd.harness._errors import SubscriptionLostError
from loopd.harness.core.events import EphemeralEvent, Lifecycle, LoopEvent, Scope, SessionEvent

DEFAULT_QUEUE = 256
CATCH_UP_PAGE = 256
RECENT = 128
"""Committed envelopes the hub keeps for catch-ups (a contiguous run of seqs ending with the last published)."""


@dataclass(frozen=True, slots=True)
class Envelope:
    """An event as subscribers see it: enduring events carry their journal ``seq``, ephemeral ones ``None``."""

    session_id: str
    seq: int | None
    event: SessionEvent | LoopEvent | EphemeralEvent

    @property
    def lifecycle(self) -> Lifecycle:
        return self.event.lifecycle

    @property
    def loop(self) -> str | None:
        return getattr(self.event, "loop", None)


Reader = Callable[[int, int], Awaitable[list[Envelope]]]


@dataclass(frozen=True, slots=True)
class EventFilter:
    lifecycles: frozenset[Lifecycle] | None = None
    loops: frozenset[str] | None = None
    kinds: frozenset[str] | None = None

    def accepts(self, env: Envelope) -> bool:
        event = env.event
        if self.lifecycles is not None and event.lifecycle not in self.lifecycles:
            return False
        if self.kinds is not None and event.kind not in self.kinds:
            return False
        return not (self.loops is not None and event.scope is Scope.LOOP and env.loop not in self.loops)


class Subscription:
    """An async iterator of `Envelope`s. Ends when the session stops; `aclose` ends it early."""

    def __init__(
        self,
        hub: Hub,
        flt: EventFilter,
        maxsize: int,
        from_seq: int | None,
        reader: Reader | None,
        recent: Collection[Envelope] | None = None,
    ) -> None:
        self._hub = hub
        self._filter = flt
        self._maxsize = maxsize
        self._queue: deque[Envelope] = deque()
        self._ready = asyncio.Event()
        self._phase: Literal["catch_up", "live"] = "live" if from_seq is None else "catch_up"
        self._next_seq = from_seq if from_seq is not None else 0
        self._resync = False
        self._reader = reader
        self._backlog: deque[Envelope] = deque()
        self._from_memory = recent is not None
        """The catch-up is ``recent`` (every committed envelope from ``from_seq`` on): no journal read, unless a
        live overflow during it asks for a resync."""
        if recent is not None:
            self._backlog.extend(recent)
        self._ended = False
        self._lost = False
        self._error: BaseException | None = None
        self.last_seq = 0 if from_seq is None else from_seq - 1
        self.dropped = 0

    # --- publisher side (never blocks; the hub calls these) ---------------------------------------------------

    def push(self, env: Envelope) -> None:
        """Offer a published event (the hub calls this): queued if it passes the filter; on overflow an ephemeral
        one is dropped and an enduring one ends this subscription (see the module docstring)."""
        if self._ended or self._lost or not self._filter.accepts(env):
            return
        if len(self._queue) < self._maxsize:
            self._queue.append(env)
            self._ready.set()
            return
        if env.seq is None:
            self.dropped += 1
            return
        if self._phase == "catch_up":
            # Still reading the journal: it holds every enduring event, so forget the live backlog and resync.
            self._queue.clear()
            self._resync = True
            return
        self._lost = True
        self._hub.detach(self)
        self._ready.set()

    def end(self, error: BaseException | None = None) -> None:
        """The session stopped (the hub calls this): the subscriber drains what it holds, then stops (with
        ``error`` if given)."""
        if error is not None and self._error is None:
            self._error = error
        self._ended = True
        self._ready.set()

    @property
    def live(self) -> bool:
        """True once the journal catch-up is over (or there was none): events now come from the hub only."""
        return self._phase == "live"

    # --- subscriber side -----------------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Envelope]:
        return self

    async def __anext__(self) -> Envelope:
        while True:
            if self._phase == "catch_up":
                env = await self._catch_up_next()
                if env is not None:
                    return self._deliver(env)
                continue
            if self._queue:
                env = self._queue.popleft()
                if env.seq is not None and env.seq < self._next_seq:
                    continue  # already delivered from the journal
                return self._deliver(env)
            if self._lost:
                # Everything queued before the overflow was delivered; resume from the next seq.
                raise SubscriptionLostError(self.last_seq)
            if self._error is not None:
                raise self._error
            if self._ended:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()

    async def _catch_up_next(self) -> Envelope | None:
        if not self._backlog and self._from_memory and not self._resync:
            self._phase = "live"  # the hub's recent envelopes reached the last committed seq
            return None
        if not self._backlog:
            self._from_memory = False
            assert self._reader is not None
            self._resync = False
            page = await self._reader(self._next_seq, CATCH_UP_PAGE)
            self._backlog.extend(e for e in page if e.seq is not None and e.seq >= self._next_seq)
            if len(page) < CATCH_UP_PAGE and not self._resync and not self._backlog:
                self._phase = "live"
                return None
            if not self._backlog:
                return None
        env = self._backlog.popleft()
        assert env.seq is not None
        self._next_seq = env.seq + 1
        if not self._filter.accepts(env):
            self.last_seq = env.seq
            return None
        return env

    def _deliver(self, env: Envelope) -> Envelope:
        if env.seq is not None:
            self.last_seq = env.seq
            self._next_seq = env.seq + 1
        return env

    async def aclose(self) -> None:
        self._hub.detach(self)
        self.end()
        self._queue.clear()
        self._backlog.clear()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class Hub:
    def __init__(self, session_id: str, reader: Reader | None = None) -> None:
        self.session_id = session_id
        self._reader = reader
        self._subscribers: set[Subscription] = set()
        self._recent: deque[Envelope] = deque(maxlen=RECENT)
        self._closed = False
        self._error: BaseException | None = None
        self.published = 0

    def subscribe(
        self,
        *,
        from_seq: int | None = None,
        lifecycles: Collection[Lifecycle] | None = None,
        loops: Collection[str] | None = None,
        kinds: Collection[str] | None = None,
        maxsize: int = DEFAULT_QUEUE,
        committed: int | None = None,
    ) -> Subscription:
        """``committed``: the seq of the last committed event (the session log's), when known — a catch-up the
        hub's recent envelopes cover is then served from them (see the module docstring)."""
        if maxsize < 1:
            raise ValueError("maxsize must be positive")
        if from_seq is not None and (from_seq < 1 or self._reader is None):
            raise ValueError("from_seq must be >= 1 and needs a journal")
        flt = EventFilter(
            lifecycles=frozenset(lifecycles) if lifecycles is not None else None,
            loops=frozenset(loops) if loops is not None else None,
            kinds=frozenset(kinds) if kinds is not None else None,
        )
        sub = Subscription(self, flt, maxsize, from_seq, self._reader, self._recent_from(from_seq, committed))
        if self._closed:
            sub.end(self._error)
        else:
            self._subscribers.add(sub)
        return sub

    def _recent_from(self, from_seq: int | None, committed: int | None) -> list[Envelope] | None:
        """Every committed envelope from ``from_seq`` through ``committed``, if the recent ones hold them all."""
        if from_seq is None or committed is None:
            return None
        if from_seq > committed:
            return []  # nothing committed from there yet: what comes will be published
        recent = self._recent
        if not recent or recent[-1].seq != committed or (recent[0].seq or 0) > from_seq:
            return None
        return [env for env in recent if (env.seq or 0) >= from_seq]

    def publish(self, env: Envelope) -> None:
        seq = env.seq
        if seq is not None:
            if self._recent and self._recent[-1].seq != seq - 1:
                self._recent.clear()  # not contiguous (cannot happen with one log): start the run again
            self._recent.append(env)
        self.published += 1
        for sub in tuple(self._subscribers):
            sub.push(env)

    def detach(self, sub: Subscription) -> None:
        """Stop delivering to ``sub`` (it was closed, or lost events); idempotent."""
        self._subscribers.discard(sub)

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    @property
    def live_subscriber_count(self) -> int:
        """Subscriptions past their journal catch-up, now taking published events straight from the hub."""
        return sum(1 for s in self._subscribers if s.live)

    @property
    def dropped(self) -> int:
        return sum(s.dropped for s in self._subscribers)

    def close(self, error: BaseException | None = None) -> None:
        """End every subscription after it drains what it already holds (with ``error`` if given)."""
        self._closed = True
        self._error = error
        for sub in tuple(self._subscribers):
            sub.end(error)
        self._subscribers.clear()
