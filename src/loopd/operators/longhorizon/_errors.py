"""The LongHorizon operator's errors: one root, `LongHorizonError`, under loopd's `LoopdError`.

    LongHorizonError
    ├── LongHorizonSettingsError   a setting (flag or LOOPD_LH_* variable) is invalid; one line, also a ValueError
    ├── RunGone                    the Run (or its child) is not there: its Task or conversation was deleted
    ├── StaleRun                   the Run changed since it was read (a stale status write): read it again
    └── StepFailed                 one step of a round failed (counts as a failure of the Run, never a crash)
        └── ParseError             the Manager's decision or the Auditor's verdict is not valid (also a ValueError)

Must not do: import anything of loopd but the floor's error root.
"""

from __future__ import annotations

from loopd._infra.errors import LoopdError

__all__ = ["LongHorizonError", "LongHorizonSettingsError", "ParseError", "RunGone", "StaleRun", "StepFailed"]


class LongHorizonError(LoopdError):
    """Base of every error the LongHorizon operator raises on purpose."""


class LongHorizonSettingsError(LongHorizonError, ValueError):
    """A LongHorizon setting is invalid; the message is one line naming the setting and the bad value."""


class RunGone(LongHorizonError):
    """The Run or one of its Executions / Audits does not exist (any more): its Task was deleted, e.g. with its
    conversation. The reconcile stops; nothing is left to do."""


class StaleRun(LongHorizonError):
    """The Run changed since this reconcile read it (another replica, a retried write): it is read again."""


class StepFailed(LongHorizonError):
    """A step of a round (a harness call, a parse) failed: the Run records a failure and goes on with the next
    round (three in a row ask the human). ``reason`` is the one-line message recorded in the Run's rounds."""


class ParseError(StepFailed, ValueError):
    """A role's answer is not a valid decision / verdict. ``answer`` holds (the start of) what the model said."""

    def __init__(self, message: str, *, answer: str = "") -> None:
        super().__init__(message)
        self.answer = answer[:2000]
