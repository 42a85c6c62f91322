"""loop-server storage: conversations, messages, message events, Human requests, registry, harness calls, leases.

Public face only; implementation lives in private modules. One ``Database`` runs on SQLite (a WAL file, the
embedded default) or PostgreSQL (a DSN, for replicas); repositories are reached through a transaction::

    async with open_database(data_dir / "loopd.db") as db:
        async with db.transaction() as tx:          # commits at the end of the block, rolls back on error
            input_ = await tx.messages.insert(NewMessage(...))
            await create_task_resource(...)          # raise here and the messages are gone too

Schema (``_migrations``: numbered steps recorded in ``schema_migrations``; a database newer than the code is
refused with ``SchemaTooNew``). Ids are UUIDv7 text, times fixed-width UTC text, JSON compact text.

- ``conversations`` (id, name, actor_kind user|operator|harness, actor_key, task_id UNIQUE NULL, times) and
  ``conversation_cursors`` (conversation_id, last_cursor): the per-conversation event counter.
- ``messages`` (id, conversation_id, task_id, kind user|harness|operator, actor_key, reply_to_message_id, purpose
  input|response|human_request|human_reply|output, status, revision, content, delivery_state ''|closing|closed,
  completion, human_due_at, times).
- ``message_events`` ((message_id, seq), conversation_id, event_cursor UNIQUE per conversation, event).
- ``human_requests`` (message_id, task_id, effect_key UNIQUE per task, params_hash, ask/confirm fields, asker,
  timeout_seconds, due_at, outcome pending|success|dismissed|timeout|failure, value, reason, resolution).
- ``registry_actors`` ((kind, actor_key), display_name, description, expires_at).
- ``harness_calls`` (id, (owner_uid, effect_key) UNIQUE, params, fingerprint, target, conversation/message ids,
  phase, result, error, deadline_at, checkpoint, replay_hash, execution_ref, cancel_requested).
- ``leases`` (resource, holder, token, expires_at): fencing tokens only grow.
- ``task_outputs`` ((task_id, output_key), params_hash, message_id UNIQUE, end_intent): an operator's keyed
  outputs, stored with their message.
- ``ledger_*``: the AgentLedger tables, used by ``loopd.server.ledger``.

Errors: see ``StorageError`` (``_errors``), a branch of ``loopd.server._errors.LoopServerError``. This package
imports nothing of loopd but the floor (``loopd._infra``: ids, databases, migrations) and ``loopd.server._errors``.
"""

from __future__ import annotations

from ._actor_leases import DEFAULT_LEASE_SECONDS, MAX_LEASE_SECONDS
from ._database import Database, DatabaseOptions, Transaction, open_database
from ._errors import (
    CommitOutcomeUnknown,
    Conflict,
    Fenced,
    InvalidRecord,
    NotFound,
    SchemaTooNew,
    StorageError,
    StorageUnavailable,
)
from ._forks import FORK_MODES, ConversationFork, ForkMode
from ._harness_calls import TRACE_PARAM as HARNESS_CALL_TRACE_PARAM
from ._harness_calls import fingerprint as harness_call_fingerprint
from ._migrations import MIGRATIONS, Migration
from ._records import (
    CONVERSATION_ACTOR_KINDS,
    DELIVERY_STATES,
    HARNESS_ACTIVE_PHASES,
    HARNESS_PHASES,
    HARNESS_TERMINAL_PHASES,
    HUMAN_OUTCOMES,
    HUMAN_REQUEST_TYPES,
    HUMAN_TERMINAL_OUTCOMES,
    MESSAGE_KINDS,
    MESSAGE_PURPOSES,
    MESSAGE_STATUSES,
    REGISTRY_KINDS,
    Conversation,
    ConversationActorKind,
    DeliveryState,
    HarnessCall,
    HarnessPhase,
    HumanOutcome,
    HumanRequest,
    HumanRequestType,
    Lease,
    Message,
    MessageEvent,
    MessageHead,
    MessageKind,
    MessagePurpose,
    MessageStatus,
    NewHarnessCall,
    NewHumanRequest,
    NewMessage,
    RegisteredActor,
    RegistryKind,
)
from ._task_outputs import TaskOutput
from ._tx import TransactionCore
from ._values import (
    MAX_PAGE,
    UNSET,
    Unset,
    canonical_json,
    digest,
    dumps,
    loads,
    optional_time,
    parse_time,
    require_object,
    require_text,
    time_text,
)

__all__ = [
    "CONVERSATION_ACTOR_KINDS",
    "DEFAULT_LEASE_SECONDS",
    "DELIVERY_STATES",
    "FORK_MODES",
    "HARNESS_ACTIVE_PHASES",
    "HARNESS_CALL_TRACE_PARAM",
    "HARNESS_PHASES",
    "HARNESS_TERMINAL_PHASES",
    "HUMAN_OUTCOMES",
    "HUMAN_REQUEST_TYPES",
    "HUMAN_TERMINAL_OUTCOMES",
    "MAX_LEASE_SECONDS",
    "MAX_PAGE",
    "MESSAGE_KINDS",
    "MESSAGE_PURPOSES",
    "MESSAGE_STATUSES",
    "MIGRATIONS",
    "REGISTRY_KINDS",
    "UNSET",
    "CommitOutcomeUnknown",
    "Conflict",
    "Conversation",
    "ConversationActorKind",
    "ConversationFork",
    "Database",
    "DatabaseOptions",
    "DeliveryState",
    "Fenced",
    "ForkMode",
    "HarnessCall",
    "HarnessPhase",
    "HumanOutcome",
    "HumanRequest",
    "HumanRequestType",
    "InvalidRecord",
    "Lease",
    "Message",
    "MessageEvent",
    "MessageHead",
    "MessageKind",
    "MessagePurpose",
    "MessageStatus",
    "Migration",
    "NewHarnessCall",
    "NewHumanRequest",
    "NewMessage",
    "NotFound",
    "RegisteredActor",
    "RegistryKind",
    "SchemaTooNew",
    "StorageError",
    "StorageUnavailable",
    "TaskOutput",
    "Transaction",
    "TransactionCore",
    "Unset",
    "canonical_json",
    "digest",
    "dumps",
    "harness_call_fingerprint",
    "loads",
    "open_database",
    "optional_time",
    "parse_time",
    "require_object",
    "require_text",
    "time_text",
]
