"""`CallSlots` (this engine's capacity) and `CallDriver` (the loop that claims active calls with leases and drives
them).

Driving: one driver task per engine scans the active calls (every ``poll_interval``, or at once when woken),
claims runnable ones with a fenced lease (pending calls, and calls whose earlier driver lost its lease: crashed, or
another replica) while a slot is free — all it found in one write transaction — and runs a `Drive` for each (see
``_driving``). Calls that only need closing (cancel requested, deadline passed, no adapter) are claimed without a
slot. A call is never driven twice at once: the lease is exclusive and every write checks its token. A call the
engine admits while the driver runs needs no scan: the admitting transaction takes its lease and begins it
(`CallDriver.begin_admitted`), and the drive starts as that transaction commits (`CallDriver.adopt`).

Must not do: admit calls or answer reads (``HarnessEngine`` does); it only claims what is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Final

from loopd._infra.clock import wait_event
from loopd._infra.tasks import TaskSet
from loopd._infra.telemetry import Context, current_context, extract_context, tracing_enabled
from loopd.server.storage import HARNESS_CALL_TRACE_PARAM, HarnessCall, StorageError, Transaction

from ._adapter import HarnessAdapter
from ._driving import Drive, DriveSettings, Outcome, lease_resource
from ._errors import CapacityExceeded, HarnessEngineError

_log = logging.getLogger(__name__)

PAGE: Final = 100
CLAIM_BATCH: Final = 50
"""Leases taken in one write transaction at most (a longer one would hold the SQLite write lock longer)."""
_TRACE_PARENTS: Final = 1000

Announce = Callable[[str, str | None, str | None, bool, HarnessCall | None], None]
"""``(call_id, owner_uid, effect_key, ended)``: a drive ended or a slot freed (the engine tells its listeners)."""


class CallSlots:
    """The engine's ``capacity`` slots, each held by a call id (admitted or driven here) or a short reservation."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._held: set[str] = set()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def used(self) -> int:
        return len(self._held)

    @property
    def free(self) -> int:
        return max(self._capacity - len(self._held), 0)

    @property
    def full(self) -> bool:
        return len(self._held) >= self._capacity

    def __contains__(self, key: object) -> bool:
        return key in self._held

    def refuse_if_full(self) -> None:
        """`CapacityExceeded` when no slot is free."""
        if self.full:
            raise CapacityExceeded(f"all {self._capacity} harness call slots of this server are in use; retry later")

    def reserve(self) -> str:
        """Take a slot for an admission in progress; its token (`CapacityExceeded` when none is free)."""
        self.refuse_if_full()
        token = f"reserved:{uuid.uuid4()}"
        self._held.add(token)
        return token

    def hold(self, call_id: str) -> None:
        self._held.add(call_id)

    def release(self, key: str) -> None:
        self._held.discard(key)

    def clear(self) -> None:
        self._held.clear()


class CallDriver:
    """Claims and drives this engine's share of the active calls (see the module docstring)."""

    def __init__(
        self,
        settings: DriveSettings,
        *,
        adapters: Mapping[str, HarnessAdapter],
        slots: CallSlots,
        announce: Announce,
        poll_interval: float,
        retry_delay: float,
        scan_limit: int,
    ) -> None:
        self._settings = settings
        self._db = settings.db
        self._clock = settings.clock
        self._adapters = adapters
        self._slots = slots
        self._announce = announce
        self._poll_interval = poll_interval
        self._retry_delay = retry_delay
        self._scan_limit = scan_limit
        self._drives: dict[str, Drive] = {}
        self._admitting: set[str] = set()  # begun by an admission whose transaction has not ended: not claimed
        self._starved = False  # the last scan left a runnable call for want of a slot: a freed slot scans again
        self._trace_parents: OrderedDict[str, Context] = OrderedDict()  # while tracing: who started a call here
        self._retry_after: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._tasks = TaskSet("harness call driver")  # the driver loop and one task per drive; `stop` ends them
        self._started = False
        self._closed = False
        self.claims = 0
        """Leases taken to drive or close a call."""
        self.lost = 0
        """Drives that ended because another holder took the lease."""
        self.retried = 0
        """Drives that ended because the adapter lost sight of the execution (resumed after ``retry_delay``)."""

    @property
    def driving(self) -> int:
        return len(self._drives)

    def start(self) -> None:
        """Start the driver task (once)."""
        if not self._started:
            self._started = True
            self._tasks.start(self._drive_forever(), name="loopd-harness-driver")

    @property
    def running(self) -> bool:
        """Started and not stopped: a drive handed over now (`adopt`) runs."""
        return self._started and not self._closed

    async def begin_admitted(self, tx: Transaction, call: HarnessCall) -> tuple[Drive, HarnessCall] | None:
        """In the transaction that admits ``call`` (created in it; its slot held by the admission): take its lease
        and begin it, so that it is driven the moment that transaction commits (`adopt`) — no scan, no claim and
        no transaction of its own to begin. The drive and the call as begun; None when its lease is taken (a scan
        finds it as usual). From now until `adopt` or `abandon`, scans here leave the call alone."""
        settings = self._settings
        self._admitting.add(call.id)
        lease = await tx.leases.acquire(lease_resource(call.id), settings.replica_id, settings.lease_ttl)
        if lease is None:
            return None
        trace_parent = current_context() if tracing_enabled() else None
        drive = Drive(settings, call, lease.token, self._adapters.get(call.target), trace_parent=trace_parent)
        return drive, await drive.begin_in(tx, call) or call

    def adopt(self, drive: Drive, call: HarnessCall) -> None:
        """Drive what `begin_admitted` began, now that its transaction committed (its slot is held already). A
        driver that stopped meanwhile leaves it: the lease expires and a scan (here after a restart, or another
        replica) takes the call over."""
        self._admitting.discard(call.id)
        if not self.running:
            return
        self.claims += 1
        self._drives[call.id] = drive
        self._tasks.start(self._run_drive(drive, call), name=f"loopd-drive-{call.id}")

    def abandon(self, call_id: str) -> None:
        """The admission's transaction did not commit (or may not have): scans may take the call again."""
        self._admitting.discard(call_id)

    def remember_trace(self, call_id: str) -> None:
        """Make the current trace context the parent of the call's drive (if it is driven here; bounded)."""
        self._trace_parents[call_id] = current_context()
        while len(self._trace_parents) > _TRACE_PARENTS:
            self._trace_parents.popitem(last=False)

    def wake(self) -> None:
        """Scan now rather than after the poll interval."""
        self._wake.set()

    def poke(self, call_id: str) -> None:
        """Tell the drive of ``call_id`` (if it runs here) to re-read its call."""
        found = self._drives.get(call_id)
        if found is not None:
            found.poke.set()

    def drive_of(self, call_id: str) -> Drive | None:
        """The drive of ``call_id`` when this driver runs it."""
        return self._drives.get(call_id)

    def poke_all(self) -> None:
        """Tell every drive running here to re-read its call."""
        for drive in self._drives.values():
            drive.poke.set()

    async def stop(self) -> list[tuple[str, int]]:
        """Stop the driver and every drive; the (call id, lease token) pairs they held."""
        self._closed = True
        held = [(call_id, drive.token) for call_id, drive in self._drives.items()]
        for drive in self._drives.values():
            drive.stop()
        # Cancelled again while any is left (a library may swallow one cancellation: 3.11's `wait_for` can).
        left = await self._tasks.aclose(timeout=self._db.options.operation_timeout + 5, recancel=0.5)
        if left:
            _log.warning("harness engine: %d task(s) did not stop within the shutdown timeout", left)
        self._drives.clear()
        self._slots.clear()
        return held

    async def release(self, call_id: str, token: int) -> None:
        """Give the call's lease back (another replica may claim it at once)."""
        async with self._db.transaction() as tx:
            await tx.leases.release(lease_resource(call_id), token)

    async def _drive_forever(self) -> None:
        replica = self._settings.replica_id
        while not self._closed:
            self._wake.clear()
            try:
                await self._scan()
            except (StorageError, HarnessEngineError) as exc:
                _log.warning("harness engine %s: scan failed: %s", replica, exc)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not stop every call of this replica
                _log.exception("harness engine %s: scan failed", replica)
            await wait_event(self._clock, self._wake, self._poll_interval)

    async def _active(self) -> list[HarnessCall]:
        found: list[HarnessCall] = []
        after: str | None = None
        while len(found) < self._scan_limit:
            async with self._db.transaction(read_only=True) as tx:
                page = await tx.harness_calls.list_active(after=after, limit=PAGE)
            found.extend(page)
            if len(page) < PAGE:
                break
            after = page[-1].id
        return found

    async def _scan(self) -> None:
        active = await self._active()
        ids = {call.id for call in active}
        for stale in [call_id for call_id in self._retry_after if call_id not in ids]:
            del self._retry_after[stale]
        now = self._settings.clock.now()
        ordered = [c for c in active if c.id in self._slots] + [c for c in active if c.id not in self._slots]
        waiting = deque(
            (call, call.cancel_requested or now >= call.deadline_at or call.target not in self._adapters)
            for call in ordered
            if call.id not in self._drives
            and call.id not in self._admitting
            and self._retry_after.get(call.id, 0.0) <= self._clock.monotonic()
        )
        starved = False
        while waiting and not self._closed:
            free = self._slots.free  # now: admissions may have taken slots while the previous batch was claimed
            batch: list[tuple[HarnessCall, bool]] = []
            while waiting and len(batch) < CLAIM_BATCH:
                call, closing_only = waiting.popleft()
                if not closing_only and call.id not in self._slots:
                    if free == 0:
                        starved = True  # no slot: a freed one wakes the next scan
                        continue
                    free -= 1
                batch.append((call, closing_only))
            if batch:
                await self._claim(batch)
        self._starved = starved

    async def _claim(self, batch: list[tuple[HarnessCall, bool]]) -> None:
        """Take the leases of ``batch`` (call, whether it only needs closing) in one write transaction and drive each
        call whose lease this replica got. Claiming call by call put every claim behind the writes of the drives
        already running: under a burst, calls started one after another instead of together."""
        held = [call.id for call, closing_only in batch if not closing_only and call.id not in self._slots]
        for call_id in held:  # counted before the transaction: an admission meanwhile sees these slots taken
            self._slots.hold(call_id)
        settings = self._settings
        try:
            async with self._db.transaction() as tx:
                # In call id order: replicas claiming the same calls at once lock their lease rows in one order.
                leases = {
                    call.id: await tx.leases.acquire(lease_resource(call.id), settings.replica_id, settings.lease_ttl)
                    for call in sorted((call for call, _ in batch), key=lambda call: call.id)
                }
        except BaseException:
            for call_id in held:
                self._slots.release(call_id)
            raise
        for call, closing_only in batch:
            lease = leases[call.id]
            if lease is None:  # another holder drives it
                if call.id in self._slots:
                    self._slots.release(call.id)
                    self._announce(call.id, call.owner_uid, call.effect_key, False, None)
                continue
            if not closing_only:
                self._slots.hold(call.id)
            drive = Drive(
                settings,
                call,
                lease.token,
                self._adapters.get(call.target),
                trace_parent=self._trace_parents.pop(call.id, None) or _stored_trace(call),
            )
            self.claims += 1
            self._drives[call.id] = drive
            self._tasks.start(self._run_drive(drive, call), name=f"loopd-drive-{call.id}")

    async def _run_drive(self, drive: Drive, call: HarnessCall) -> None:
        outcome: Outcome = "retry"
        try:
            outcome = await drive.run()
        except (StorageError, HarnessEngineError) as exc:
            _log.warning("harness call %s: drive stopped: %s", drive.call_id, exc)
        except Exception:
            _log.exception("harness call %s: drive failed", drive.call_id)
        finally:
            self._drives.pop(drive.call_id, None)
            self._slots.release(drive.call_id)
            if self._starved:  # a call waits here for a slot (admissions take theirs before they create the call)
                self._wake.set()
        self._announce(call.id, call.owner_uid, call.effect_key, outcome == "done", drive.ended_call)
        if outcome == "lost":
            self.lost += 1
            return
        if outcome == "retry":
            self.retried += 1
            self._retry_after[drive.call_id] = self._clock.monotonic() + self._retry_delay
        if drive.released:  # given up by the transaction that ended the call
            return
        with contextlib.suppress(StorageError, TimeoutError):
            async with asyncio.timeout(self._db.options.operation_timeout):
                await self.release(drive.call_id, drive.token)


def _stored_trace(call: HarnessCall) -> Context | None:
    """The trace context stored with the call when it was created (`HARNESS_CALL_TRACE_PARAM`): a drive on another
    replica, or after a restart, continues the call's trace. None while tracing is off or when none was stored."""
    if not tracing_enabled():
        return None
    carrier = call.params.get(HARNESS_CALL_TRACE_PARAM)
    if not isinstance(carrier, Mapping) or not isinstance(carrier.get("traceparent"), str):
        return None
    return extract_context({key: str(value) for key, value in carrier.items() if isinstance(key, str)})
