"""The LongHorizon domain resources: ``Run``, ``Execution`` and ``Audit`` in ``longhorizon.loopd.dev/v1alpha1``.

Owns: the typed models (camelCase on the wire, snake_case in Python, like ``loopd.resources.Task``), their
declarations (names, scope, status subresource, printer columns, immutable spec) and their bounds.
Must not do: I/O, or decide anything about the loop (the operator writes these; the models only describe them).
The CRD manifests are generated from these models by ``_crds.crds()``.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints

from loopd.resources import KindDeclaration, KindRef, KubeObject, PrinterColumn, WireModel

GROUP = "longhorizon.loopd.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

#: Longest goal, contract, plan or guidance text (characters).
MAX_TEXT = 16_000
#: Longest question the Manager may ask a person.
MAX_QUESTION = 4_000
#: Most choices in a Manager question.
MAX_CHOICES = 20
#: History references a new Run carries.
MAX_CONTEXT_MESSAGES = 20
#: Follow-up input message ids one Run takes in its life.
MAX_INPUT_MESSAGES = 100
#: Report message ids one Execution lists.
MAX_REPORT_MESSAGES = 50
#: Round records a Run keeps (the last ones).
MAX_ROUND_RECORDS = 50
#: Round budget bounds and default.
DEFAULT_MAX_ROUNDS = 25
MAX_ROUNDS_LIMIT = 1_000
#: Longest identifier (message id, call id, uid, name) stored in these resources.
MAX_ID = 253
#: Longest one-line summary or error text.
MAX_NOTE = 16_000

Id = Annotated[str, StringConstraints(max_length=MAX_ID)]

RunPhase = Literal[
    "Receiving", "Planning", "Executing", "Auditing", "WaitingForHuman", "Succeeded", "Stopped", "Failed"
]
#: Phases a Run never leaves.
TERMINAL_RUN_PHASES: frozenset[str] = frozenset({"Succeeded", "Stopped", "Failed"})
StepPhase = Literal["Running", "Completed", "Failed"]
DecisionNext = Literal["cli", "ask", "blocked", "done"]
HumanReason = Literal["ask", "budget", "failure"]
Integrity = Literal["clean", "violated", "unknown"]

RUN_KIND = KindRef(API_VERSION, "Run")
EXECUTION_KIND = KindRef(API_VERSION, "Execution")
AUDIT_KIND = KindRef(API_VERSION, "Audit")


class ObjectRef(WireModel):
    """Names one object exactly: its name and the uid of that incarnation."""

    name: str = Field(min_length=1, max_length=MAX_ID, description="Object name.")
    uid: str = Field(default="", max_length=MAX_ID, description="Object uid (empty when not known yet).")


class ContextMessage(WireModel):
    """One history reference a Run starts with: a message of a conversation."""

    conversation_id: str = Field(alias="conversationID", min_length=1, max_length=MAX_ID)
    message_id: str = Field(alias="messageID", min_length=1, max_length=MAX_ID)


class Condition(WireModel):
    """One observed condition (Kubernetes style): ``Succeeded`` or ``WaitingForHuman`` on a Run."""

    type: str = Field(min_length=1, max_length=316)
    status: Literal["True", "False", "Unknown"]
    reason: str | None = Field(default=None, max_length=1024)
    message: str | None = Field(default=None, max_length=32_768)
    last_transition_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    observed_generation: int | None = Field(default=None, ge=0)


class Choice(WireModel):
    """One answer the Manager offers a person."""

    value: str = Field(min_length=1, max_length=MAX_QUESTION)
    label: str = Field(default="", max_length=MAX_QUESTION)


class Decision(WireModel):
    """The Manager's decision for a round (wire names as the Manager's JSON: ``allow_other``)."""

    next: DecisionNext = Field(description="cli (run a plan), ask or blocked (ask a person), done.")
    summary: str = Field(default="", max_length=MAX_NOTE)
    plan: str = Field(default="", max_length=MAX_TEXT, description="What the Executor does (next=cli).")
    contract: str = Field(default="", max_length=MAX_TEXT, description="The acceptance contract; a change bumps it.")
    question: str = Field(default="", max_length=MAX_QUESTION, description="What to ask (next=ask|blocked).")
    choices: list[Choice] | None = Field(default=None, max_length=MAX_CHOICES)
    allow_other: bool = Field(default=False, alias="allow_other", description="Free text besides the choices.")


class Verdict(WireModel):
    """The Auditor's verdict (wire names as the Auditor's JSON: ``task_state``)."""

    complete: bool = Field(description="The contract is met (requires clean integrity and evidence).")
    integrity: Integrity = Field(description="clean, violated or unknown.")
    task_state: str = Field(default="", alias="task_state", max_length=MAX_NOTE)
    evidence: str = Field(default="", max_length=MAX_TEXT, description="What the Auditor checked, concretely.")
    feedback: str = Field(default="", max_length=MAX_TEXT, description="What the Manager should fix next.")


class LastAudit(WireModel):
    """The latest finished audit a ``done`` may rest on."""

    execution: ObjectRef = Field(description="The Execution the audit judged.")
    contract_version: int = Field(ge=1, description="The contract version the audit judged.")
    message_id: str = Field(default="", alias="messageID", max_length=MAX_ID, description="The Auditor's report.")
    verdict: Verdict


class RoundRecord(WireModel):
    """What happened in one round (a Run keeps the last ``MAX_ROUND_RECORDS``)."""

    index: int = Field(ge=1)
    decision: str = Field(default="", max_length=64, description="The decision's next (cli|ask|blocked|done).")
    summary: str = Field(default="", max_length=MAX_NOTE)
    messages: list[Id] | None = Field(default=None, max_length=MAX_REPORT_MESSAGES, description="Report message ids.")
    execution: ObjectRef | None = None
    audit: ObjectRef | None = None


class RunSpec(WireModel):
    """One question worked on over rounds; immutable once created."""

    conversation: ObjectRef = Field(description="The conversation the question was asked in.")
    workspace_id: str = Field(default="", alias="workspaceID", max_length=MAX_ID)
    user_key: str = Field(default="", max_length=MAX_ID, description="Who asked (their user key).")
    deadline_at: str | None = Field(
        default=None, json_schema_extra={"format": "date-time"}, description="Past it the Run fails (RFC 3339)."
    )
    input_message_id: str = Field(alias="inputMessageID", min_length=1, max_length=MAX_ID)
    goal: str = Field(min_length=1, max_length=MAX_TEXT, description="What the user asked for.")
    max_rounds: int = Field(default=DEFAULT_MAX_ROUNDS, ge=1, le=MAX_ROUNDS_LIMIT, description="Initial budget.")
    context_messages: list[ContextMessage] | None = Field(default=None, max_length=MAX_CONTEXT_MESSAGES)


class RunStatus(WireModel):
    """Where the Run is: written by the operator through the status subresource, after each step's report."""

    input_through: str | None = Field(default=None, max_length=MAX_ID, description="Input committed through.")
    input_message_ids: list[Id] | None = Field(default=None, alias="inputMessageIDs", max_length=MAX_INPUT_MESSAGES)
    finished_at: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    phase: RunPhase | None = None
    round: int | None = Field(default=None, ge=0)
    budget: int | None = Field(default=None, ge=0, description="Last round allowed before asking to continue.")
    failures: int | None = Field(default=None, ge=0, description="Consecutive failed rounds.")
    contract: str | None = Field(default=None, max_length=MAX_TEXT)
    contract_version: int | None = Field(default=None, ge=0)
    task_state: str | None = Field(default=None, max_length=MAX_NOTE)
    guidance: str | None = Field(default=None, max_length=MAX_TEXT, description="Answers and follow-ups so far.")
    decision: Decision | None = None
    execution: ObjectRef | None = Field(default=None, description="The current round's Execution.")
    audit: ObjectRef | None = Field(default=None, description="The current round's Audit.")
    last_audit: LastAudit | None = None
    human_message_id: str | None = Field(default=None, alias="humanMessageID", max_length=MAX_ID)
    human_reason: HumanReason | None = None
    manager_message_id: str | None = Field(default=None, alias="managerMessageID", max_length=MAX_ID)
    final_message_id: str | None = Field(default=None, alias="finalMessageID", max_length=MAX_ID)
    summary: str | None = Field(default=None, max_length=MAX_NOTE)
    consumed_through: str | None = Field(default=None, max_length=MAX_ID)
    rounds: list[RoundRecord] | None = Field(default=None, max_length=MAX_ROUND_RECORDS)
    conditions: list[Condition] | None = Field(default=None, max_length=8)


class ExecutionSpec(WireModel):
    """One round's plan for the Executor; immutable once created."""

    run: str = Field(min_length=1, max_length=MAX_ID, description="The Run's name.")
    round: int = Field(ge=1)
    contract_version: int = Field(ge=1)
    contract: str = Field(default="", max_length=MAX_TEXT)
    plan: str = Field(min_length=1, max_length=MAX_TEXT)
    report_message_ids: list[Id] | None = Field(default=None, alias="reportMessageIDs", max_length=MAX_REPORT_MESSAGES)


class ExecutionStatus(WireModel):
    """How the Executor's call went."""

    phase: StepPhase | None = None
    call_id: str | None = Field(default=None, alias="callID", max_length=MAX_ID)
    message_id: str | None = Field(default=None, alias="messageID", max_length=MAX_ID)
    error: str | None = Field(default=None, max_length=MAX_NOTE)


class AuditSpec(WireModel):
    """One round's check of an Execution against the contract; immutable once created."""

    run: str = Field(min_length=1, max_length=MAX_ID, description="The Run's name.")
    round: int = Field(ge=1)
    contract_version: int = Field(ge=1)
    contract: str = Field(default="", max_length=MAX_TEXT)
    execution: ObjectRef = Field(description="The Execution audited.")
    execution_message_id: str = Field(default="", alias="executionMessageID", max_length=MAX_ID)


class AuditStatus(ExecutionStatus):
    """How the Auditor's call went, and its verdict."""

    verdict: Verdict | None = None


_GROUP_NAMES = ("loopd", "longhorizon")
_ROUND_COLUMNS = (
    PrinterColumn("Run", "string", ".spec.run", "The Run"),
    PrinterColumn("Round", "integer", ".spec.round", "Round"),
    PrinterColumn("Phase", "string", ".status.phase", "Running, Completed or Failed"),
)


def _declaration(kind: str, short_name: str, columns: tuple[PrinterColumn, ...], description: str) -> KindDeclaration:
    """A LongHorizon kind: namespaced, with the status subresource, an immutable spec, ``columns`` then Age."""
    return KindDeclaration(
        group=GROUP,
        version=VERSION,
        kind=kind,
        plural=f"{kind.lower()}s",
        singular=kind.lower(),
        namespaced=True,
        status_subresource=True,
        short_names=(short_name,),
        categories=_GROUP_NAMES,
        immutable_spec=True,
        printer_columns=(*columns, PrinterColumn("Age", "date", ".metadata.creationTimestamp")),
        description=description,
    )


class Run(KubeObject):
    """One LongHorizon question: named after its Task, owned by it; owns its Executions and Audits."""

    declaration: ClassVar[KindDeclaration] = _declaration(
        "Run",
        "lhrun",
        (
            PrinterColumn("Phase", "string", ".status.phase", "Where the loop is"),
            PrinterColumn("Round", "integer", ".status.round", "Current round"),
            PrinterColumn("Budget", "integer", ".status.budget", "Last round before asking to continue"),
            PrinterColumn("Contract", "integer", ".status.contractVersion", "Contract version"),
        ),
        "A LongHorizon Run: one question worked on by a Manager, an Executor and an Auditor.",
    )

    spec: RunSpec = Field(description="The question and its bounds; immutable.")
    status: RunStatus | None = Field(default=None, description="Where the loop is; written by the operator.")


class Execution(KubeObject):
    """One round's execution (``<run>-r<round>``), owned by its Run."""

    declaration: ClassVar[KindDeclaration] = _declaration(
        "Execution",
        "lhexec",
        _ROUND_COLUMNS,
        "One round's plan run by the LongHorizon Executor; owned by its Run.",
    )

    spec: ExecutionSpec = Field(description="The plan and the contract it serves; immutable.")
    status: ExecutionStatus | None = Field(default=None, description="How the Executor's call went.")


class Audit(KubeObject):
    """One round's audit (same name as its Execution), owned by the Run."""

    declaration: ClassVar[KindDeclaration] = _declaration(
        "Audit",
        "lhaudit",
        (
            *_ROUND_COLUMNS,
            PrinterColumn("Complete", "boolean", ".status.verdict.complete", "The contract is met"),
            PrinterColumn("Integrity", "string", ".status.verdict.integrity", "clean, violated or unknown"),
        ),
        "One round's read-only check of an Execution by the LongHorizon Auditor; owned by the Run.",
    )

    spec: AuditSpec = Field(description="What is audited against which contract version; immutable.")
    status: AuditStatus | None = Field(default=None, description="How the Auditor's call went, and its verdict.")


#: The three kinds, in the order their CRDs are applied.
MODELS: tuple[type[KubeObject], ...] = (Run, Execution, Audit)


def execution_name(run_name: str, round_index: int) -> str:
    """The name of round ``round_index``'s Execution (and Audit) of Run ``run_name``: ``<run>-r<round>``."""
    return f"{run_name}-r{round_index}"
