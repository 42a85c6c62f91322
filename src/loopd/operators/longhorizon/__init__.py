"""The LongHorizon operator: a Manager, an Executor and an Auditor working over Run / Execution / Audit resources.

Public face of ``loopd.operators.longhorizon``. Imports only ``loopd.runtime``, ``loopd.resources`` and
``loopd._infra`` (never the server, the harness or the CLI).
"""

from __future__ import annotations

from ._crds import crds
from ._resources import (
    API_VERSION,
    AUDIT_KIND,
    EXECUTION_KIND,
    GROUP,
    RUN_KIND,
    VERSION,
    Audit,
    AuditSpec,
    AuditStatus,
    Choice,
    Condition,
    ContextMessage,
    Decision,
    Execution,
    ExecutionSpec,
    ExecutionStatus,
    LastAudit,
    ObjectRef,
    RoundRecord,
    Run,
    RunSpec,
    RunStatus,
    Verdict,
    execution_name,
)

__all__ = [
    "API_VERSION",
    "AUDIT_KIND",
    "EXECUTION_KIND",
    "GROUP",
    "RUN_KIND",
    "VERSION",
    "Audit",
    "AuditSpec",
    "AuditStatus",
    "Choice",
    "Condition",
    "ContextMessage",
    "Decision",
    "Execution",
    "ExecutionSpec",
    "ExecutionStatus",
    "LastAudit",
    "ObjectRef",
    "RoundRecord",
    "Run",
    "RunSpec",
    "RunStatus",
    "Verdict",
    "crds",
    "execution_name",
]
