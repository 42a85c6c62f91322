"""Versioned schema migrations for the loop-server database (both backends run the same DDL).

Owns: the numbered steps (``MIGRATIONS``) and the server's ``Schema`` (steps recorded in ``schema_migrations``).
The floor's migrator (``loopd._infra.migrations``) applies them: each missing step in its own transaction (plus a
PostgreSQL advisory lock, so replicas starting together take turns); applying twice is a no-op; a database that
has a step this code does not know is refused with ``SchemaTooNew``. Steps are append-only: never edit one that
has shipped. Must not do: data access beyond the schema (repositories own that).

Portable column types: ids and enums are ``TEXT``; timestamps are fixed-width UTC ``TEXT`` (they sort by time);
JSON is ``TEXT`` (byte-exact round trips, which canonical digests rely on); flags are ``BOOLEAN``.
"""

from __future__ import annotations

from collections.abc import Sequence

from loopd._infra.migrations import Migration, Schema

_ADVISORY_LOCK = 7_305_553_271  # pg_advisory_xact_lock key: one migrator at a time

__all__ = ["MIGRATIONS", "Migration", "schema"]

_CHAT = Migration(
    1,
    "chat, human requests, registry, harness calls, leases",
    (
        """CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            actor_kind TEXT NOT NULL,
            actor_key TEXT NOT NULL,
            task_id TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        "CREATE UNIQUE INDEX conversations_by_task ON conversations (task_id)",
        "CREATE INDEX conversations_by_owner ON conversations (actor_kind, actor_key, id)",
        """CREATE TABLE conversation_cursors (
            conversation_id TEXT PRIMARY KEY,
            last_cursor BIGINT NOT NULL
        )""",
        """CREATE TABLE messages (
            id TEXT PRIMARY KEY,
            conversation_id TEXT NOT NULL,
            task_id TEXT,
            kind TEXT NOT NULL,
            actor_key TEXT NOT NULL,
            reply_to_message_id TEXT,
            purpose TEXT NOT NULL,
            status TEXT NOT NULL,
            revision BIGINT NOT NULL,
            content TEXT NOT NULL,
            delivery_state TEXT NOT NULL,
            completion TEXT,
            human_due_at TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        "CREATE INDEX messages_by_conversation ON messages (conversation_id, id)",
        "CREATE INDEX messages_by_task ON messages (task_id, purpose, id)",
        "CREATE INDEX messages_by_delivery ON messages (delivery_state, id)",
        """CREATE TABLE message_events (
            message_id TEXT NOT NULL,
            seq BIGINT NOT NULL,
            conversation_id TEXT NOT NULL,
            event_cursor BIGINT NOT NULL,
            event TEXT NOT NULL,
            created_at TEXT NOT NULL,
            PRIMARY KEY (message_id, seq)
        )""",
        "CREATE UNIQUE INDEX message_events_by_cursor ON message_events (conversation_id, event_cursor)",
        """CREATE TABLE human_requests (
            message_id TEXT PRIMARY KEY,
            task_id TEXT NOT NULL,
            conversation_id TEXT NOT NULL,
            effect_key TEXT NOT NULL,
            params_hash TEXT NOT NULL,
            request_type TEXT NOT NULL,
            title TEXT NOT NULL,
            prompt TEXT NOT NULL,
            choices TEXT NOT NULL,
            allow_other BOOLEAN NOT NULL,
            confirm_label TEXT,
            decline_label TEXT,
            asker_kind TEXT NOT NULL,
            asker_key TEXT NOT NULL,
            timeout_seconds DOUBLE PRECISION NOT NULL,
            due_at TEXT NOT NULL,
            outcome TEXT NOT NULL,
            outcome_value TEXT,
            outcome_reason TEXT,
            reply_message_id TEXT,
            resolved_by TEXT,
            resolved_at TEXT,
            created_at TEXT NOT NULL,
            UNIQUE (task_id, effect_key)
        )""",
        "CREATE INDEX human_requests_by_due ON human_requests (outcome, due_at)",
        """CREATE TABLE registry_actors (
            kind TEXT NOT NULL,
            actor_key TEXT NOT NULL,
            id TEXT NOT NULL UNIQUE,
            display_name TEXT NOT NULL,
            description TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (kind, actor_key)
        )""",
        """CREATE TABLE harness_calls (
            id TEXT PRIMARY KEY,
            owner_uid TEXT NOT NULL,
            effect_key TEXT NOT NULL,
            params TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            target TEXT NOT NULL,
            conversation_id TEXT,
            message_id TEXT,
            phase TEXT NOT NULL,
            result TEXT,
            error TEXT,
            deadline_at TEXT NOT NULL,
            checkpoint BIGINT NOT NULL,
            replay_hash TEXT NOT NULL,
            execution_ref TEXT,
            cancel_requested BOOLEAN NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            UNIQUE (owner_uid, effect_key)
        )""",
        "CREATE INDEX harness_calls_by_phase ON harness_calls (phase, id)",
        """CREATE TABLE leases (
            resource TEXT PRIMARY KEY,
            holder TEXT NOT NULL,
            token BIGINT NOT NULL,
            expires_at TEXT NOT NULL,
            acquired_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
    ),
)

_LEDGER = Migration(
    2,
    "ledger",
    (
        """CREATE TABLE ledger_actors (
            id TEXT PRIMARY KEY,
            actor_type TEXT NOT NULL,
            framework TEXT,
            actor_key TEXT UNIQUE,
            attributes TEXT NOT NULL,
            created_at TEXT NOT NULL
        )""",
        """CREATE TABLE ledger_lanes (
            id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            name TEXT NOT NULL,
            parent_lane_id TEXT,
            task_id TEXT,
            conversation_id TEXT,
            harness_call_id TEXT,
            attributes TEXT NOT NULL,
            last_seq BIGINT NOT NULL,
            created_at TEXT NOT NULL,
            UNIQUE (session_id, run_id, name)
        )""",
        "CREATE INDEX ledger_lanes_by_task ON ledger_lanes (task_id)",
        "CREATE INDEX ledger_lanes_by_conversation ON ledger_lanes (conversation_id)",
        "CREATE INDEX ledger_lanes_by_call ON ledger_lanes (harness_call_id)",
        """CREATE TABLE ledger_turns (
            id TEXT PRIMARY KEY,
            lane_id TEXT NOT NULL,
            attributes TEXT NOT NULL,
            created_at TEXT NOT NULL
        )""",
        """CREATE TABLE ledger_actions (
            id TEXT PRIMARY KEY,
            turn_id TEXT NOT NULL,
            lane_id TEXT NOT NULL,
            action_type TEXT NOT NULL,
            parent_action_id TEXT,
            effect_kind TEXT NOT NULL DEFAULT 'unknown',
            idempotency TEXT NOT NULL DEFAULT 'unknown',
            name TEXT,
            attributes TEXT NOT NULL,
            created_at TEXT NOT NULL
        )""",
        """CREATE TABLE ledger_attempts (
            id TEXT PRIMARY KEY,
            action_id TEXT NOT NULL,
            lane_id TEXT NOT NULL,
            attempt_no INTEGER NOT NULL,
            created_at TEXT NOT NULL,
            UNIQUE (action_id, attempt_no)
        )""",
        """CREATE TABLE ledger_events (
            id TEXT PRIMARY KEY,
            lane_id TEXT NOT NULL,
            seq BIGINT NOT NULL,
            subject_id TEXT NOT NULL,
            event_type TEXT NOT NULL,
            actor_id TEXT NOT NULL,
            occurred_at TEXT NOT NULL,
            payload TEXT NOT NULL,
            extensions TEXT NOT NULL,
            causation_id TEXT,
            schema_version TEXT NOT NULL,
            append_id TEXT NOT NULL,
            committed_at TEXT NOT NULL,
            input_tokens BIGINT,
            output_tokens BIGINT,
            cost_usd DOUBLE PRECISION,
            UNIQUE (lane_id, seq)
        )""",
        "CREATE INDEX ledger_events_by_subject ON ledger_events (subject_id, event_type)",
        "CREATE INDEX ledger_events_by_type ON ledger_events (event_type, lane_id)",
        """CREATE TABLE ledger_appends (
            id TEXT PRIMARY KEY,
            lane_id TEXT NOT NULL,
            digest TEXT NOT NULL,
            first_seq BIGINT NOT NULL,
            last_seq BIGINT NOT NULL,
            event_ids TEXT NOT NULL,
            committed_at TEXT NOT NULL
        )""",
        """CREATE TABLE ledger_checkpoints (
            id TEXT PRIMARY KEY,
            checkpoint_key TEXT NOT NULL,
            revision BIGINT NOT NULL,
            actor_id TEXT NOT NULL,
            format TEXT NOT NULL,
            state TEXT,
            artifact_ref TEXT,
            anchor TEXT,
            extensions TEXT NOT NULL,
            schema_version TEXT NOT NULL,
            digest TEXT NOT NULL,
            created_at TEXT NOT NULL,
            UNIQUE (checkpoint_key, revision)
        )""",
    ),
)

_ONE_CALL_PER_MESSAGE = Migration(
    3,
    "one harness call per destination message",
    (
        # Two calls streaming into one message would interleave their projections: refuse it in the database.
        "CREATE UNIQUE INDEX harness_calls_one_per_message ON harness_calls (message_id) WHERE message_id IS NOT NULL",
    ),
)

_ACCESS = Migration(
    4,
    "access: actor tokens, browser cookies issued to remote peers, one-time sign-in codes",
    (
        # Only SHA-256 digests of secrets are stored: a copy of the database signs nobody in.
        """CREATE TABLE access_tokens (
            token_hash TEXT PRIMARY KEY,
            actor_kind TEXT NOT NULL,
            actor_key TEXT NOT NULL,
            created_at TEXT NOT NULL
        )""",
        "CREATE INDEX access_tokens_by_actor ON access_tokens (actor_kind, actor_key)",
        """CREATE TABLE browser_cookies (
            cookie_hash TEXT PRIMARY KEY,
            issued_by TEXT NOT NULL,
            created_at TEXT NOT NULL
        )""",
        """CREATE TABLE signin_codes (
            code_hash TEXT PRIMARY KEY,
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            used_at TEXT
        )""",
    ),
)

_OPERATOR_OUTPUTS = Migration(
    5,
    "operator API: keyed Task outputs, Tasks listed per responder",
    (
        # The key is stored in the same transaction as its message: a key names one message, across crashes too.
        """CREATE TABLE task_outputs (
            task_id TEXT NOT NULL,
            output_key TEXT NOT NULL,
            params_hash TEXT NOT NULL,
            message_id TEXT NOT NULL UNIQUE,
            end_intent TEXT,
            created_at TEXT NOT NULL,
            PRIMARY KEY (task_id, output_key)
        )""",
        # GET /v1/tasks?target_kind=&target_key=: a responder's open Tasks, paged by task id. Partial, so the
        # closed Tasks (every Task ever answered) are not in it and a listing reads only the open ones.
        "CREATE INDEX messages_open_by_responder ON messages (kind, actor_key, task_id) "
        "WHERE purpose = 'response' AND delivery_state <> 'closed'",
    ),
)

_LEDGER_ARTIFACTS = Migration(
    6,
    "ledger artifacts: content-addressed prompts and replies, and which lanes use them (retention)",
    (
        # The body is UTF-8 JSON text (redacted before it is hashed); identical content is stored once.
        """CREATE TABLE ledger_artifacts (
            sha256 TEXT PRIMARY KEY,
            content_type TEXT NOT NULL,
            size BIGINT NOT NULL,
            body TEXT NOT NULL,
            created_at TEXT NOT NULL
        )""",
        """CREATE TABLE ledger_artifact_uses (
            sha256 TEXT NOT NULL,
            lane_id TEXT NOT NULL,
            PRIMARY KEY (sha256, lane_id)
        )""",
        "CREATE INDEX ledger_artifact_uses_by_lane ON ledger_artifact_uses (lane_id)",
    ),
)

_CONVERSATION_TITLES = Migration(
    7,
    "conversation titles and summaries, written by a background run (its state: '', running, done, failed)",
    (
        "ALTER TABLE conversations ADD COLUMN title TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE conversations ADD COLUMN summary TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE conversations ADD COLUMN title_state TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE conversations ADD COLUMN title_run TEXT NOT NULL DEFAULT ''",
    ),
)

_CONVERSATION_FORKS = Migration(
    8,
    "conversation forks: where a forked conversation came from (retry from here, edit and resend)",
    (
        """CREATE TABLE conversation_forks (
            conversation_id TEXT PRIMARY KEY,
            parent_conversation_id TEXT NOT NULL,
            parent_message_id TEXT NOT NULL,
            source_message_id TEXT NOT NULL,
            mode TEXT NOT NULL,
            created_at TEXT NOT NULL
        )""",
        "CREATE INDEX conversation_forks_by_parent ON conversation_forks (parent_conversation_id)",
    ),
)

_LEDGER_SCOPE_INDEXES = Migration(
    9,
    "ledger: a Task's, conversation's or call's turns and actions found from its lanes (no scan of every turn)",
    (
        "CREATE INDEX ledger_turns_by_lane ON ledger_turns (lane_id)",
        "CREATE INDEX ledger_actions_by_turn ON ledger_actions (turn_id)",
    ),
)

_CONVERSATION_MODE = Migration(
    10,
    "conversation mode: the mode its built-in harness calls start in ('': the harness's own)",
    ("ALTER TABLE conversations ADD COLUMN mode TEXT NOT NULL DEFAULT ''",),
)

_MESSAGE_TAILS = Migration(
    11,
    "message snapshots with a tail: the last event seq the stored content folds, when later events are not in it",
    ("ALTER TABLE messages ADD COLUMN content_seq BIGINT",),
)

MIGRATIONS: tuple[Migration, ...] = (
    _CHAT,
    _LEDGER,
    _ONE_CALL_PER_MESSAGE,
    _ACCESS,
    _OPERATOR_OUTPUTS,
    _LEDGER_ARTIFACTS,
    _CONVERSATION_TITLES,
    _CONVERSATION_FORKS,
    _LEDGER_SCOPE_INDEXES,
    _CONVERSATION_MODE,
    _MESSAGE_TAILS,
)
"""Every step this code knows, in order; ``MIGRATIONS[-1].version`` is the schema version it needs."""


def schema(steps: Sequence[Migration] = MIGRATIONS) -> Schema:
    """The server's schema for the floor's migrator: its steps, recorded in ``schema_migrations`` (the table this
    schema has always used, so existing databases open as they are)."""
    return Schema("server", tuple(steps), table="schema_migrations", lock_key=_ADVISORY_LOCK)
