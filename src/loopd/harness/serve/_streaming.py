"""Server-sent events for one session: gap-free from any journal seq, then live, with heartbeats.

Framing: an enduring or terminal event is sent with ``id:`` = its journal seq and ``event:`` = its kind; an
ephemeral one (token deltas, tool progress) with ``event:`` but no ``id:``, so a client's Last-Event-ID is always the
seq of the last *stored* event it saw. ``data:`` is the `EventItem` JSON. A comment line (``: ping``) goes out after
``heartbeat`` seconds of silence.

Resuming: the stream is served through ``Session.subscribe(from_seq=...)``: catch-up from the journal, then live,
without a gap or a duplicate and without a time window. A dormant session is served from the journal, and the stream
attaches to it when it becomes live here. If the client reads too slowly and its subscription overflows, the stream
ends with an ``error`` event (``resume_from`` in its data); the client reconnects with its Last-Event-ID.

A stream only observes: closing it closes its subscription and nothing else (a connection never owns execution).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator
from typing import Any, Final

from loopd._infra.http_errors import ApiError, ErrorType, error_body
from loopd._infra.sse import SSE_PING, sse_message
from loopd._infra.tasks import cancel_and_wait, race
from loopd.harness._errors import HarnessError, SubscriptionLostError
from loopd.harness.actors import Envelope, Subscription
from loopd.harness.core import codec
from loopd.harness.serve._sessions import ServedSessions
from loopd.harness.serve._wire import event_json

RETRY: Final = b"retry: 2000\n\n"  # how long a browser's EventSource waits before it reconnects
_CATCH_UP_PAGE: Final = 256


def envelope_frame(env: Envelope) -> bytes:
    return sse_message(event_json(env.seq, env.event), event=env.event.kind, id=env.seq)


def error_frame(type: ErrorType, message: str, **extra: Any) -> bytes:
    body: dict[str, Any] = error_body(type, message)
    body["error"].update(extra)
    return sse_message(json.dumps(body, separators=(",", ":")), event="error")


async def event_frames(
    registry: ServedSessions,
    session_id: str,
    *,
    from_seq: int,
    heartbeat: float,
    queue_size: int = 256,
) -> AsyncGenerator[bytes, None]:
    """The SSE byte frames of ``session_id`` from journal seq ``from_seq`` on, until the server closes."""
    next_seq = from_seq
    greeted = False  # the first frame goes out once the stream is attached, so a client that sees the response
    # start can act (e.g. send an input) without missing its live-only events
    while not registry.closing.is_set():
        changed = registry.changed()
        session = registry.live(session_id)
        if session is not None and session.status == "active" and session.fault is None:
            sub = session.subscribe(from_seq=next_seq, maxsize=queue_size)
            try:
                if not greeted:
                    greeted = True
                    yield RETRY
                async with contextlib.aclosing(_with_heartbeat(sub, heartbeat, registry.closing)) as items:
                    async for item in items:
                        if item is None:
                            yield SSE_PING
                            continue
                        if item.seq is not None:
                            next_seq = item.seq + 1
                        yield envelope_frame(item)
            except SubscriptionLostError as exc:
                yield error_frame(
                    "service_unavailable",
                    f"this stream fell behind the session; reconnect with Last-Event-ID: {exc.last_seq}",
                    resume_from=exc.last_seq + 1,
                )
                return
            except (HarnessError, codec.CodecError) as exc:  # the session faulted, or the journal failed
                yield error_frame("service_unavailable", str(exc), resume_from=next_seq)
                return
            finally:
                await sub.aclose()
            continue  # the session stopped: serve the rest from the journal below
        # Not live here: serve what the journal holds, then wait for the session to come alive.
        if not greeted:
            greeted = True
            yield RETRY
        try:
            page = await registry.read(session_id, next_seq, _CATCH_UP_PAGE)
            envelopes = [Envelope(session_id, r.seq, codec.decode(r.kind, r.version, r.data)) for r in page]
        except (ApiError, HarnessError, codec.CodecError) as exc:
            yield error_frame("service_unavailable", f"the journal could not be read: {exc}", resume_from=next_seq)
            return
        for env in envelopes:
            next_seq = env.seq + 1 if env.seq is not None else next_seq
            yield envelope_frame(env)
        if len(page) == _CATCH_UP_PAGE:
            continue
        if session is not None and session.fault is not None:
            yield error_frame("service_unavailable", str(session.fault), resume_from=next_seq)
            return
        waited = await _wait_any(changed, registry.closing, timeout=heartbeat)
        if not waited:
            yield SSE_PING


async def _with_heartbeat(
    sub: Subscription, heartbeat: float, closing: asyncio.Event
) -> AsyncGenerator[Envelope | None, None]:
    """The subscription's envelopes, with ``None`` after each ``heartbeat`` seconds of silence; ends on ``closing``."""
    pending: asyncio.Future[Any] | None = None
    closer: asyncio.Future[Any] = asyncio.ensure_future(closing.wait())
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(sub.__anext__())
            done, _ = await asyncio.wait({pending, closer}, timeout=heartbeat, return_when=asyncio.FIRST_COMPLETED)
            if pending in done:
                finished, pending = pending, None
                try:
                    env: Envelope = finished.result()
                except StopAsyncIteration:
                    return
                yield env
            elif closer in done:
                return
            else:
                yield None
    finally:  # both are this generator's own: ended here (a cancellation of the reader is passed on)
        for task in (pending, closer):
            if task is not None and not task.done():
                await cancel_and_wait(task)


async def _wait_any(first: asyncio.Event, second: asyncio.Event, *, timeout: float) -> bool:
    """Whether either event was set within ``timeout``."""
    if first.is_set() or second.is_set():
        return True
    try:
        async with asyncio.timeout(timeout):
            await race(first.wait(), second.wait())  # the first to be set cancels the other wait
    except TimeoutError:
        return first.is_set() or second.is_set()
    return True
