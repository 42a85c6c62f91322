"""The Router's errors: one root, `RouterError`, under loopd's `LoopdError`.

    RouterError
    ├── RouterSettingsError   a setting (flag or LOOPD_ROUTER_* variable) is invalid; one line, also a ValueError
    └── TaskFailed            this Task cannot be answered: it completes with ``router_failed`` and the message
        └── PlanError         the model's plan is not a valid plan (also a ValueError)

Must not do: import anything of loopd but the floor's error root.
"""

from __future__ import annotations

from loopd._infra.errors import LoopdError

__all__ = ["PlanError", "RouterError", "RouterSettingsError", "TaskFailed"]


class RouterError(LoopdError):
    """Base of every error the Router raises on purpose."""


class RouterSettingsError(RouterError, ValueError):
    """A Router setting is invalid; the message is one line naming the setting and the bad value."""


class TaskFailed(RouterError):
    """The Task cannot be answered (a failed or empty harness call, an invalid plan): it completes with
    ``router_failed`` and this message. Permanent: trying again would do the same."""


class PlanError(TaskFailed, ValueError):
    """The planner's answer is not a valid plan. ``answer`` holds what the model said."""

    def __init__(self, message: str, *, answer: str = "") -> None:
        super().__init__(message)
        self.answer = answer
