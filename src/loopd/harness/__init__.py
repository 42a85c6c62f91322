"""loopd.harness — a durable, observable, permissioned agent runtime.

The public face. Implementation lives in private modules and the subpackages:
``core`` (pure), ``runtime`` (actors, hub), ``journal``, ``models``, ``tools``.
"""

from loopd.harness import core
from loopd.harness._errors import (
    BudgetExceeded,
    ForkPointError,
    HarnessError,
    InvalidTransitionError,
    JournalCorruptError,
    JournalError,
    JournalFencedError,
    MailboxFullError,
    ModelError,
    ModelPermanentError,
    ModelRetryableError,
    SessionBusyError,
    SessionClosedError,
    SessionFaultError,
    SessionNotFoundError,
    SubscriptionLostError,
    ToolArgumentsError,
    ToolError,
)
from loopd.harness.actors import (
    AgentStatus,
    Budget,
    BudgetPolicy,
    DelegationError,
    Envelope,
    LoopDefinition,
    Rig,
    Session,
    SessionStatistics,
    Subscription,
)
from loopd.harness.core import EffectKind, Idempotency, Message, ToolCall, ToolOutcome, Usage, events
from loopd.harness.core.commands import CancelQueuedInput, Interrupt, Shutdown, UserInput
from loopd.harness.core.events import Lifecycle, Scope
from loopd.harness.journal import Journal, MemoryJournal, SqliteJournal
from loopd.harness.models import Model, ModelRequest, Reply, ScriptedModel, ToolSpec
from loopd.harness.tools import EchoTool, PreparedCall, Requirement, Tool, ToolContext, ToolResult

__all__ = [
    "AgentStatus",
    "Budget",
    "BudgetExceeded",
    "BudgetPolicy",
    "CancelQueuedInput",
    "DelegationError",
    "EchoTool",
    "EffectKind",
    "Envelope",
    "ForkPointError",
    "HarnessError",
    "Idempotency",
    "Interrupt",
    "InvalidTransitionError",
    "Journal",
    "JournalCorruptError",
    "JournalError",
    "JournalFencedError",
    "Lifecycle",
    "LoopDefinition",
    "MailboxFullError",
    "MemoryJournal",
    "Message",
    "Model",
    "ModelError",
    "ModelPermanentError",
    "ModelRequest",
    "ModelRetryableError",
    "PreparedCall",
    "Reply",
    "Requirement",
    "Rig",
    "Scope",
    "ScriptedModel",
    "Session",
    "SessionBusyError",
    "SessionClosedError",
    "SessionFaultError",
    "SessionNotFoundError",
    "SessionStatistics",
    "Shutdown",
    "SqliteJournal",
    "Subscription",
    "SubscriptionLostError",
    "Tool",
    "ToolArgumentsError",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolOutcome",
    "ToolResult",
    "ToolSpec",
    "Usage",
    "UserInput",
    "core",
    "events",
]
