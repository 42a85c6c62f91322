"""`LongHorizonSettings`: rounds, timeouts, retention, workspace and harness target, from explicit values over
``LOOPD_LH_*`` variables.

    LOOPD_LH_MAX_ROUNDS        default round budget of a Run (default 25, 1..1000)
    LOOPD_LH_MANAGER_TIMEOUT   one Manager call (default 5m)
    LOOPD_LH_EXECUTOR_TIMEOUT  one Executor call (default 30m)
    LOOPD_LH_AUDITOR_TIMEOUT   one Auditor call (default 5m)
    LOOPD_LH_HUMAN_TIMEOUT     one question to the human (default 30m)
    LOOPD_LH_RUN_TIMEOUT       a Run's deadline after it starts (default 24h)
    LOOPD_LH_RETENTION_TTL     how long a finished Run is kept before it is deleted (default 24h)
    LOOPD_LH_WORKSPACE         directory (under the server's workspaces of ``operator:longhorizon``) holding one
                               workspace per Run (default ``runs``: a Run works in ``runs/<run uid>``)
    LOOPD_LH_TARGET            the harness every role's call goes to (default ``assistant``)
    LOOPD_LH_CONCURRENCY       Tasks worked at once: the watch's workers (default 4)

Durations are seconds (``300``) or a number with a unit (``90s``, ``5m``, ``24h``, ``2d``, ``1h30m``), positive.
Explicit values (CLI flags) win over the environment; an invalid value raises `LongHorizonSettingsError` with one
line naming it. Nothing is read after `LongHorizonSettings.from_env` returns.

Must not do: I/O beyond reading the given environment mapping.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from loopd.operators.longhorizon._errors import LongHorizonSettingsError

__all__ = ["ENV_PREFIX", "HARD_MAX_ROUNDS", "LongHorizonSettings", "parse_duration"]

ENV_PREFIX: Final = "LOOPD_LH_"
HARD_MAX_ROUNDS: Final = 1000
"""No Run's budget grows past this: a Run over it stops instead of asking for more."""
_TARGET: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_WORKSPACE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}(/[A-Za-z0-9][A-Za-z0-9._-]{0,62}){0,3}")
_DURATION_PART: Final = re.compile(r"(\d+(?:\.\d+)?)(d|h|m|s)")
_UNITS: Final = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_DURATIONS: Final = (
    "manager_timeout",
    "executor_timeout",
    "auditor_timeout",
    "human_timeout",
    "run_timeout",
    "retention_ttl",
)
_MAX_DURATION: Final = 366 * 86400.0


def parse_duration(raw: str) -> float:
    """Seconds of ``raw`` (``"300"``, ``"90s"``, ``"5m"``, ``"1h30m"``); ``ValueError`` unless positive."""
    text = raw.strip().lower()
    if not text:
        raise ValueError("empty duration")
    try:
        seconds = float(text)
    except ValueError:
        pos = 0
        seconds = 0.0
        for match in _DURATION_PART.finditer(text):
            if match.start() != pos:
                raise ValueError(f"not a duration: {raw!r}") from None
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if pos != len(text):
            raise ValueError(f"not a duration: {raw!r}") from None
    if not seconds > 0 or seconds != seconds or seconds > _MAX_DURATION:
        raise ValueError(f"not a positive duration: {raw!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class LongHorizonSettings:
    """The LongHorizon operator's configuration (validated at construction; durations in seconds)."""

    max_rounds: int = 25
    """The round budget a new Run gets (1..1000); past it the human is asked to continue."""
    manager_timeout: float = 300.0
    """Seconds one Manager call may run."""
    executor_timeout: float = 1800.0
    """Seconds one Executor call may run."""
    auditor_timeout: float = 300.0
    """Seconds one Auditor call may run."""
    human_timeout: float = 1800.0
    """Seconds a question to the human stays open before it times out (the Run then stops)."""
    run_timeout: float = 86400.0
    """Seconds from a Run's start to its deadline (the Run fails when it passes)."""
    retention_ttl: float = 86400.0
    """Seconds a finished Run (and its Executions and Audits) is kept before it is deleted."""
    workspace: str = "runs"
    """Directory of one workspace per Run (``<workspace>/<run uid>``), relative to the server's workspaces of this
    operator (``<data dir>-workspaces/operator/longhorizon`` for `loopd up`)."""
    target: str = "assistant"
    """The harness key every Manager, Executor and Auditor call goes to."""
    concurrency: int = 4
    """How many Tasks the operator works on at once (the watch's workers)."""

    def __post_init__(self) -> None:
        for name in ("max_rounds", "concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LongHorizonSettingsError(f"{name} must be a positive integer, not {value!r}")
        if self.max_rounds > HARD_MAX_ROUNDS:
            raise LongHorizonSettingsError(f"max_rounds must be at most {HARD_MAX_ROUNDS}, not {self.max_rounds!r}")
        for name in _DURATIONS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= _MAX_DURATION:
                raise LongHorizonSettingsError(f"{name} must be a positive number of seconds, not {value!r}")
        if not isinstance(self.target, str) or not _TARGET.fullmatch(self.target):
            raise LongHorizonSettingsError(
                f"target must be a harness key (letters, digits, '.', '_', '-'; at most 100), not {self.target!r}"
            )
        if not isinstance(self.workspace, str) or not _WORKSPACE.fullmatch(self.workspace) or ".." in self.workspace:
            raise LongHorizonSettingsError(
                f"workspace must be a relative directory (letters, digits, '.', '_', '-', up to 4 levels), "
                f"not {self.workspace!r}"
            )

    def timeout_of(self, role: str) -> float:
        """The call timeout of ``role`` (manager, executor or auditor)."""
        return float(getattr(self, f"{role}_timeout"))

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        **given: Any,
    ) -> LongHorizonSettings:
        """Explicit values (keyword arguments named like the fields; None = not given) over ``LOOPD_LH_*`` in
        ``env`` (default ``os.environ``)."""
        source = os.environ if env is None else env
        unknown = set(given) - set(cls.__dataclass_fields__)
        if unknown:
            raise TypeError(f"unknown LongHorizon settings: {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        for name in cls.__dataclass_fields__:
            if given.get(name) is not None:
                values[name] = given[name]
                continue
            variable = ENV_PREFIX + name.upper()
            raw = source.get(variable, "").strip()
            if not raw:
                continue
            if name in _DURATIONS:
                try:
                    values[name] = parse_duration(raw)
                except ValueError:
                    raise LongHorizonSettingsError(
                        f"{variable} must be a positive duration (seconds, or e.g. 90s, 5m, 24h), not {raw!r}"
                    ) from None
            elif name in ("max_rounds", "concurrency"):
                try:
                    number = int(raw, 10)
                except ValueError:
                    number = 0
                limit = HARD_MAX_ROUNDS if name == "max_rounds" else None
                if number < 1 or (limit is not None and number > limit):
                    bound = f"an integer from 1 to {limit}" if limit else "a positive integer"
                    raise LongHorizonSettingsError(f"{variable} must be {bound}, not {raw!r}")
                values[name] = number
            else:
                values[name] = raw
        try:
            return replace(cls(), **values)
        except LongHorizonSettingsError as exc:  # a value from a variable: the message names the variable
            message = str(exc)
            for name in values:
                if given.get(name) is None and message.startswith(f"{name} must"):
                    raise LongHorizonSettingsError(ENV_PREFIX + name.upper() + message[len(name) :]) from None
            raise
