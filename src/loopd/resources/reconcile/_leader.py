"""Leader election on ``coordination.k8s.io/v1`` Leases (client-go's ``leaderelection``, in Python).

Owns: acquiring, renewing and releasing one Lease for one identity, and deciding when leadership is lost.
Must not do: start or stop controllers (the manager does), or read time except through its ``Clock``.

Rules (as client-go):

- Expiry is judged on the *local* clock: a candidate records when it last saw the lease record change and
  treats it as expired ``leaseDurationSeconds`` after that — clocks of different machines are never compared.
- Every write is an optimistic update (the lease's ``resourceVersion``): of two candidates racing, one gets
  ``Conflict`` and stays a follower.
- A leader that cannot renew for ``renew_deadline`` seconds steps down. Because
  ``renew_deadline < lease_duration``, it has stopped before anyone else may take over.
- Release (on graceful shutdown) clears the holder so a standby can take over after one ``retry_period``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from loopd._infra.clock import Clock, SystemClock, wait_event, with_timeout
from loopd.resources import AlreadyExists, Conflict, NotFound, ResourceError
from loopd.resources.client import LEASES, JsonObject, ResourceClient

logger = logging.getLogger(__name__)


def default_identity() -> str:
    """``<hostname>_<random>``: unique per process, readable in ``kubectl get lease``."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class LeaderElection:
    """Which Lease to hold, as whom, and the timing (seconds, client-go's defaults)."""

    lease_name: str
    namespace: str = "default"
    identity: str = field(default_factory=default_identity)
    lease_duration: float = 15.0
    """How long a standby waits, after it last saw the lease change, before taking it over."""
    renew_deadline: float = 10.0
    """How long the leader keeps trying to renew before it steps down."""
    retry_period: float = 2.0
    """The pause between two attempts to acquire or renew."""

    def __post_init__(self) -> None:
        if not self.lease_name or not self.identity:
            raise ValueError("lease_name and identity must not be empty")
        if not self.lease_duration > self.renew_deadline > self.retry_period > 0:
            raise ValueError("need lease_duration > renew_deadline > retry_period > 0")


@dataclass(frozen=True, slots=True)
class LeaderStatistics:
    identity: str
    is_leader: bool
    holder: str | None
    """The holder this candidate last observed (itself while leading)."""
    acquisitions: int
    renewals: int
    losses: int
    """Terms that ended because renewing failed (not by release)."""
    failed_attempts: int


@dataclass(frozen=True, slots=True)
class _Record:
    holder: str | None
    duration: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int

    @classmethod
    def from_lease(cls, lease: Mapping[str, Any]) -> _Record:
        spec = lease.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or None,
            duration=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> JsonObject:
        return {
            "holderIdentity": self.holder or "",
            "leaseDurationSeconds": self.duration,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.transitions,
        }


def format_micro_time(moment: datetime) -> str:
    """Kubernetes ``MicroTime``: RFC 3339 UTC with microseconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One candidate for one Lease."""

    def __init__(self, client: ResourceClient, config: LeaderElection, *, clock: Clock | None = None) -> None:
        self._client = client
        self._config = config
        self._clock = clock or SystemClock()
        self._observed: _Record | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0
        self._is_leader = False
        self._acquisitions = 0
        self._renewals = 0
        self._losses = 0
        self._failed_attempts = 0

    @property
    def config(self) -> LeaderElection:
        return self._config

    @property
    def is_leader(self) -> bool:
        return self._is_leader

    def statistics(self) -> LeaderStatistics:
        return LeaderStatistics(
            identity=self._config.identity,
            is_leader=self._is_leader,
            holder=self._observed.holder if self._observed else None,
            acquisitions=self._acquisitions,
            renewals=self._renewals,
            losses=self._losses,
            failed_attempts=self._failed_attempts,
        )

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Try every ``retry_period`` until this candidate leads (``True``) or ``stop`` is set (``False``)."""
        while not stop.is_set():
            if await self._attempt(self._config.renew_deadline):
                self._is_leader = True
                self._acquisitions += 1
                logger.info("%s now leads lease %s", self._config.identity, self._config.lease_name)
                return True
            if await wait_event(self._clock, stop, self._config.retry_period):
                break
        return False

    async def keep_leading(self) -> None:
        """Renew every ``retry_period``; return when leadership is lost (renewing failed for too long)."""
        config = self._config
        while self._is_leader:
            await self._clock.sleep(config.retry_period)
            remaining = config.renew_deadline - (self._clock.monotonic() - self._renewed_at)
            if remaining > 0 and await self._attempt(remaining):
                self._renewals += 1
                continue
            taken = self._observed is not None and self._observed.holder not in (None, config.identity)
            if taken or self._clock.monotonic() - self._renewed_at >= config.renew_deadline:
                self._is_leader = False
                self._losses += 1
                logger.warning("%s lost lease %s", config.identity, config.lease_name)

    async def release(self) -> bool:
        """Give the lease up if held (graceful shutdown); whether the lease is known to be free of us."""
        if not self._is_leader:
            return True
        self._is_leader = False
        try:
            return await with_timeout(self._clock, self._release(), self._config.renew_deadline)
        except (ResourceError, TimeoutError) as exc:
            logger.warning("%s could not release lease %s: %s", self._config.identity, self._config.lease_name, exc)
            return False

    async def try_acquire_or_renew(self) -> bool:
        """One attempt: create the lease, renew our hold on it, or take it over once expired."""
        config = self._config
        now = self._clock.monotonic()
        stamp = format_micro_time(self._clock.now())
        try:
            lease = await self._client.get(LEASES, config.lease_name, namespace=config.namespace)
        except NotFound:
            record = _Record(config.identity, self._duration_seconds(), stamp, stamp, 0)
            try:
                created = await self._client.create(
                    LEASES,
                    {
                        "apiVersion": LEASES.api_version,
                        "kind": LEASES.kind,
                        "metadata": {"name": config.lease_name, "namespace": config.namespace},
                        "spec": record.to_spec(),
                    },
                    namespace=config.namespace,
                )
            except (AlreadyExists, Conflict):
                return False
            self._observe(_Record.from_lease(created), now)
            self._renewed_at = now
            return True

        observed = _Record.from_lease(lease)
        if observed != self._observed:
            self._observe(observed, now)
        leading_elsewhere = observed.holder is not None and observed.holder != config.identity
        if leading_elsewhere and self._observed_at + observed.duration > now:
            return False
        if observed.holder == config.identity:
            record = _Record(
                config.identity, self._duration_seconds(), observed.acquire_time, stamp, observed.transitions
            )
        else:
            record = _Record(config.identity, self._duration_seconds(), stamp, stamp, observed.transitions + 1)
        lease["spec"] = {**(lease.get("spec") or {}), **record.to_spec()}
        try:
            updated = await self._client.update(LEASES, lease)
        except Conflict:
            return False
        self._observe(_Record.from_lease(updated), now)
        self._renewed_at = now
        return True

    async def _attempt(self, timeout: float) -> bool:
        try:
            ok = await with_timeout(self._clock, self.try_acquire_or_renew(), timeout)
        except (ResourceError, TimeoutError) as exc:
            logger.info("%s: lease %s attempt failed: %s", self._config.identity, self._config.lease_name, exc)
            ok = False
        except Exception:
            # A malformed lease or a client bug must not end the campaign: count it and try again later.
            logger.warning("%s: lease %s attempt failed", self._config.identity, self._config.lease_name, exc_info=True)
            ok = False
        if not ok:
            self._failed_attempts += 1
        return ok

    async def _release(self) -> bool:
        config = self._config
        lease = await self._client.get(LEASES, config.lease_name, namespace=config.namespace)
        observed = _Record.from_lease(lease)
        if observed.holder != config.identity:
            return True
        stamp = format_micro_time(self._clock.now())
        released = _Record(None, 1, stamp, stamp, observed.transitions)
        lease["spec"] = {**(lease.get("spec") or {}), **released.to_spec()}
        try:
            updated = await self._client.update(LEASES, lease)
        except Conflict:
            return False
        self._observe(_Record.from_lease(updated), self._clock.monotonic())
        logger.info("%s released lease %s", config.identity, config.lease_name)
        return True

    def _observe(self, record: _Record, at: float) -> None:
        self._observed = record
        self._observed_at = at

    def _duration_seconds(self) -> int:
        return max(1, math.ceil(self._config.lease_duration))
