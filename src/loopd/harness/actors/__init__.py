"""The harness runtime: rig, sessions, loop actors, mailbox, hub, effect execution (the I/O side)."""

from loopd.harness.actors._budget import UNLIMITED, Budget, BudgetPolicy
from loopd.harness.actors._delegation import DELEGATION_TOOL_NAMES, AgentStatus, DelegationError, Subagents
from loopd.harness.actors._hub import Envelope, EventFilter, Hub, Subscription
from loopd.harness.actors._hustle import DEFAULT_LANES, HustleLanes, HustleQueueFullError, HustleResult
from loopd.harness.actors._loop import LoopDefinition
from loopd.harness.actors._mailbox import Mailbox
from loopd.harness.actors._rig import RecoveryMode, Rig
from loopd.harness.actors._session import Session, SessionStatistics
from loopd.harness.actors._session_log import SessionLog
from loopd.harness.actors._workspace import NothingToUndoError, SessionWorkspace, WorkspaceBusyError

__all__ = [
    "DEFAULT_LANES",
    "DELEGATION_TOOL_NAMES",
    "UNLIMITED",
    "AgentStatus",
    "Budget",
    "BudgetPolicy",
    "DelegationError",
    "Envelope",
    "EventFilter",
    "Hub",
    "HustleLanes",
    "HustleQueueFullError",
    "HustleResult",
    "LoopDefinition",
    "Mailbox",
    "NothingToUndoError",
    "RecoveryMode",
    "Rig",
    "Session",
    "SessionLog",
    "SessionStatistics",
    "SessionWorkspace",
    "Subagents",
    "Subscription",
    "WorkspaceBusyError",
]
