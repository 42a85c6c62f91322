"""Retention of the ledger's prompts and replies: `ArtifactRetention` prunes on open and then periodically.

An artifact goes once every lane that uses it has had no event committed for ``keep`` seconds (a lane still in use
keeps its whole message chain, however old its first segments are). The trail's events stay: an attempt whose
artifacts went says so (``/v1/ledger/attempt`` answers ``expired``). Must not do: decide the setting (the server's
configuration does: ``ledger.retention`` / ``LOOPD_LEDGER_RETENTION`` / ``--ledger-retention``).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Final

from loopd._infra.clock import Clock
from loopd.server.storage import StorageError

from ._store import LedgerStore

_log = logging.getLogger(__name__)

MAX_INTERVAL: Final = 3600.0
"""A sweep at least hourly (more often when ``keep`` is short: every ``keep / 4``)."""


class ArtifactRetention:
    """Deletes the artifacts of lanes idle for longer than ``keep`` seconds, on the store's clock."""

    def __init__(self, store: LedgerStore, keep: float, clock: Clock, *, interval: float | None = None) -> None:
        if not keep > 0:
            raise ValueError("keep must be a positive number of seconds")
        self._store = store
        self._keep = keep
        self._clock = clock
        self.interval = interval if interval is not None else min(MAX_INTERVAL, keep / 4)

    async def sweep(self) -> int:
        """One pass; how many artifacts were deleted."""
        removed = await self._store.prune_artifacts(self._clock.now() - timedelta(seconds=self._keep))
        if removed:
            _log.info("ledger retention removed %d prompt/reply artifacts", removed)
        return removed

    async def run(self) -> None:
        """Sweep now and then every ``interval`` seconds until cancelled; a failed pass is logged and retried."""
        while True:
            try:
                await self.sweep()
            except (StorageError, OSError, TimeoutError) as exc:
                _log.warning("ledger retention pass failed (retried in %.0f s): %s", self.interval, exc)
            except asyncio.CancelledError:
                raise
            await self._clock.sleep(self.interval)
