"""The LongHorizon operator: a Manager, an Executor and an Auditor working over Run / Execution / Audit resources.

Per Task addressed to ``operator:longhorizon`` a **Run** (named after the Task, owned by it) goes round after round::

    Receiving → Planning (Manager: cli | ask | blocked | done) → Executing (Executor, tools ``write`` in the Run's
    workspace; an Execution ``<run>-r<n>``) → Auditing (Auditor, tools ``read``; an Audit of that Execution) →
    Receiving …   WaitingForHuman (ask, budget, failure)   terminal: Succeeded, Stopped, Failed (deadline)

``done`` is accepted only after a clean, complete audit of the current contract version. Every harness call is keyed
``<runUID>/round/<n>/<role>`` (a restart re-attaches, never repeats), each role's report is streamed into the Task's
work conversation (``operator/longhorizon/<role>``) before the status is written, human questions are keyed
``<runUID>/round/<n>/human-<reason>``. The summary answers the Task; the Run is kept for the retention TTL.

Public face: `LongHorizon` (the reconciler, with ``register``, ``watch``, ``collect``), `LongHorizonSettings`,
`demo_rules` (the demo model's answers to the three roles), the resources (`Run`, `Execution`, `Audit`, their specs
and statuses, `crds`), the pure parts (the phase machine's `RunState` and transitions, `parse_decision`,
`parse_verdict`, the prompts) and the errors. See docs/longhorizon.md.

Must not import: loopd.server, loopd.harness, loopd.cli — it talks to loopd only through ``loopd.runtime``.
"""

from __future__ import annotations

from ._auditor import AUDITOR_HEADER, auditor_prompt, parse_verdict
from ._crds import crds
from ._demo import demo_rules
from ._errors import LongHorizonError, LongHorizonSettingsError, ParseError, RunGone, StaleRun, StepFailed
from ._executor import EXECUTOR_HEADER, executor_prompt
from ._manager import MANAGER_HEADER, manager_prompt, parse_decision
from ._operator import (
    FAILURE_CODE,
    LONGHORIZON_DESCRIPTION,
    LONGHORIZON_DISPLAY_NAME,
    LONGHORIZON_KEY,
    LongHorizon,
    effect_key,
    human_key,
)
from ._phases import RunState, answered, audited, completion_problem, decided, executed, expire, receive, start
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
from ._settings import ENV_PREFIX, LongHorizonSettings
from ._store import RunStore

__all__ = [
    "API_VERSION",
    "AUDITOR_HEADER",
    "AUDIT_KIND",
    "ENV_PREFIX",
    "EXECUTION_KIND",
    "EXECUTOR_HEADER",
    "FAILURE_CODE",
    "GROUP",
    "LONGHORIZON_DESCRIPTION",
    "LONGHORIZON_DISPLAY_NAME",
    "LONGHORIZON_KEY",
    "MANAGER_HEADER",
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
    "LongHorizon",
    "LongHorizonError",
    "LongHorizonSettings",
    "LongHorizonSettingsError",
    "ObjectRef",
    "ParseError",
    "RoundRecord",
    "Run",
    "RunGone",
    "RunSpec",
    "RunState",
    "RunStatus",
    "RunStore",
    "StaleRun",
    "StepFailed",
    "Verdict",
    "answered",
    "audited",
    "auditor_prompt",
    "completion_problem",
    "crds",
    "decided",
    "demo_rules",
    "effect_key",
    "executed",
    "execution_name",
    "executor_prompt",
    "expire",
    "human_key",
    "manager_prompt",
    "parse_decision",
    "parse_verdict",
    "receive",
    "start",
]
