"""`RouterSettings`: how the Router plans and whom it asks, from explicit values over ``LOOPD_ROUTER_*`` variables.

    LOOPD_ROUTER_MAX_SUBTASKS   most tasks a complex plan may have (default 4)
    LOOPD_ROUTER_CONCURRENCY    Tasks reconciled at once: the watch's workers (default 4)
    LOOPD_ROUTER_TARGET         the harness every call goes to (default ``assistant``, loop-server's built-in one)
    LOOPD_ROUTER_CALL_TIMEOUT   seconds one harness call may take (default 1800)

Explicit values (CLI flags) win over the environment; integers must be positive. An invalid value raises
`RouterSettingsError` with one line naming it. Nothing is read after `RouterSettings.from_env` returns.

Must not do: I/O beyond reading the given environment mapping.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from loopd.operators.router._errors import RouterSettingsError

__all__ = ["ENV_PREFIX", "RouterSettings"]

ENV_PREFIX: Final = "LOOPD_ROUTER_"
_TARGET: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


@dataclass(frozen=True, slots=True)
class RouterSettings:
    """The Router's configuration (validated at construction)."""

    max_subtasks: int = 4
    """The most tasks a complex plan may have; a plan with more fails the Task (``router_failed``)."""
    concurrency: int = 4
    """How many Tasks the Router works on at once (the watch's workers)."""
    target: str = "assistant"
    """The harness key every plan, work and summarize call goes to."""
    call_timeout: int = 1800
    """Seconds one harness call may run before the engine times it out."""

    def __post_init__(self) -> None:
        for name in ("max_subtasks", "concurrency", "call_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RouterSettingsError(f"{name} must be a positive integer, not {value!r}")
        if not isinstance(self.target, str) or not _TARGET.fullmatch(self.target):
            raise RouterSettingsError(
                f"target must be a harness key (letters, digits, '.', '_', '-'; at most 100), not {self.target!r}"
            )

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        max_subtasks: int | None = None,
        concurrency: int | None = None,
        target: str | None = None,
        call_timeout: int | None = None,
    ) -> RouterSettings:
        """Explicit values (None = not given) over ``LOOPD_ROUTER_*`` in ``env`` (default ``os.environ``)."""
        source = os.environ if env is None else env

        def number(given: int | None, name: str) -> int | None:
            if given is not None:
                return given
            raw = source.get(ENV_PREFIX + name.upper(), "").strip()
            if not raw:
                return None
            try:
                value = int(raw, 10)
            except ValueError:
                value = 0
            if value < 1:
                raise RouterSettingsError(f"{ENV_PREFIX}{name.upper()} must be a positive integer, not {raw!r}")
            return value

        values: dict[str, Any] = {
            "max_subtasks": number(max_subtasks, "max_subtasks"),
            "concurrency": number(concurrency, "concurrency"),
            "call_timeout": number(call_timeout, "call_timeout"),
            "target": target if target is not None else (source.get(ENV_PREFIX + "TARGET", "").strip() or None),
        }
        return replace(cls(), **{name: value for name, value in values.items() if value is not None})
