"""Background inference runs ("hustles"), the pure part: their fold, lane admission, and the restore decision.

A hustle is a named model run outside a turn's critical path (compaction is one) that goes through a *lane*:
``blocking`` (someone waits for it) or ``background`` (nobody does). Each lane has a concurrency cap (runs at once)
and a queue cap (runs waiting for a slot); past both, a new hustle is refused. `HustleStarted` is journaled when a
hustle is admitted, `HustleCompleted` / `HustleFailed` when it ends; the session state keeps the *open* ones, so a
restore knows what was cut off: a hustle whose kind can be re-run from the journal is resumed, any other is failed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from loopd.harness.core.events import HustleCompleted, HustleFailed, HustleStarted

LaneName = Literal["blocking", "background"]
LANES: tuple[LaneName, ...] = ("blocking", "background")


@dataclass(frozen=True, slots=True)
class HustleInfo:
    """An open hustle, as the journal knows it."""

    hustle_id: str
    name: str
    lane: LaneName
    loop: str | None
    params: Mapping[str, Any]


EMPTY_HUSTLES: Mapping[str, HustleInfo] = MappingProxyType({})


def apply_hustles(
    hustles: Mapping[str, HustleInfo], event: HustleStarted | HustleCompleted | HustleFailed
) -> Mapping[str, HustleInfo]:
    """Fold one hustle event: a start opens it, an end closes it (an end without a start changes nothing)."""
    out = dict(hustles)
    match event:
        case HustleStarted(hustle_id=hid, name=name, lane=lane, for_loop=loop, params=params):
            out[hid] = HustleInfo(hustle_id=hid, name=name, lane=lane, loop=loop, params=MappingProxyType(dict(params)))
        case HustleCompleted(hustle_id=hid) | HustleFailed(hustle_id=hid):
            out.pop(hid, None)
    return MappingProxyType(out)


@dataclass(frozen=True, slots=True)
class LaneLimits:
    """A lane's caps: ``concurrency`` runs at once, at most ``queue`` more waiting for a slot."""

    concurrency: int = 2
    queue: int = 8

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.queue < 0:
            raise ValueError("a lane needs a concurrency of at least 1 and a queue of at least 0")


Admission = Literal["run", "queue", "refuse"]


def admit(limits: LaneLimits, *, running: int, waiting: int) -> Admission:
    """Whether a new hustle runs now, waits for a slot, or is refused (both caps reached)."""
    if running < limits.concurrency and waiting == 0:
        return "run"
    if waiting < limits.queue:
        return "queue"
    return "refuse"


@dataclass(frozen=True, slots=True)
class RestoreDecision:
    resume: tuple[HustleInfo, ...]
    fail: tuple[HustleInfo, ...]


def on_restore(hustles: Mapping[str, HustleInfo], resumable: Collection[str]) -> RestoreDecision:
    """Open hustles after a restore: re-run those whose kind (name) can resume from the journal, fail the rest."""
    resume = tuple(h for h in hustles.values() if h.name in resumable)
    fail = tuple(h for h in hustles.values() if h.name not in resumable)
    return RestoreDecision(resume=resume, fail=fail)
