"""The public faces of loopd.server.storage and loopd.server.ledger, and their layering."""

from __future__ import annotations

import ast
from pathlib import Path

import loopd.server.ledger as ledger
import loopd.server.storage as storage

SERVER = Path(storage.__file__).parent.parent


def test_every_public_name_exists() -> None:
    assert {"Database", "open_database", "Transaction", "NewMessage", "Fenced"} <= set(storage.__all__)
    assert {"LedgerStore", "SqlLedgerStore", "LaneRecorder", "requested"} <= set(ledger.__all__)
    for module in (storage, ledger):
        assert len(set(module.__all__)) == len(module.__all__)
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_errors_form_one_tree() -> None:
    for name in ("NotFound", "Conflict", "Fenced", "InvalidRecord", "SchemaTooNew", "StorageUnavailable"):
        assert issubclass(getattr(storage, name), storage.StorageError)
    for name in ("LaneConflict", "IdempotencyViolation", "RevisionConflict"):
        assert issubclass(getattr(ledger, name), storage.Conflict)
    assert storage.StorageUnavailable.retryable and not storage.Conflict.retryable
    assert (storage.NotFound.type, storage.Conflict.type, storage.InvalidRecord.type) == (
        "not_found",
        "conflict",
        "invalid_request",
    )


def test_storage_and_ledger_import_only_what_they_may() -> None:
    """Storage needs nothing of loopd but the floor (``loopd._infra``: ids, clock, databases, migrations, private
    files), the AgentUE reducer (a message read folds the tail of events behind its stored snapshot) and the
    server's error root; the ledger adds only storage and the floor's redaction and JSON text (never agentue,
    resources…)."""
    allowed = {
        "storage": {"loopd._infra.", "loopd.agentue", "loopd.server._errors"},
        "ledger": {
            "loopd._infra.ids",
            "loopd._infra.clock",
            "loopd._infra.redaction",
            "loopd._infra.jsontext",
            "loopd.server.storage",
        },
    }
    for package, permitted in allowed.items():
        for path in (SERVER / package).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("loopd"):
                    assert any(str(node.module).startswith(p) for p in permitted), f"{path.name}: {node.module}"
