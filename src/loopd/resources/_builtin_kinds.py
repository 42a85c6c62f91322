"""The kinds every store serves: ``Task``, ``Lease``, ``Namespace`` and ``CustomResourceDefinition``.

Owns: the typed models of Task and Lease, their declarations, and ``builtin_kind_specs`` / ``builtin_crds``.
Must not do: I/O. The Task stays minimal (design §9.3): routing and wake revision in the spec; the status says
who holds it, in which phase and since when — never any content of the question or the answer.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from ._kinds import KindRef, KindSpec, PrinterColumn
from ._models import KindDeclaration, KubeObject, WireModel, crd_from_model, kind_spec_from_model

TASK_KIND = KindRef("loopd.dev/v1alpha1", "Task")
LEASE_KIND = KindRef("coordination.k8s.io/v1", "Lease")
NAMESPACE_KIND = KindRef("v1", "Namespace")
CRD_KIND = KindRef("apiextensions.k8s.io/v1", "CustomResourceDefinition")


class TaskTarget(WireModel):
    """Who responds to the Task."""

    kind: Literal["operator", "harness"] = Field(description="Responder kind: operator or harness.")
    key: str = Field(min_length=1, description="Registry key of the responder.")


class TaskSpec(WireModel):
    """What the Task asks for: which responder answers it. The question itself stays in loopd's storage."""

    target: TaskTarget = Field(description="Who responds to the Task: an operator or a harness, by registry key.")
    revision: int = Field(default=1, ge=1, description="Wake revision; bumped by the server to re-wake the responder.")


class TaskCondition(WireModel):
    """One observed condition of the Task (Kubernetes style)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    observed_generation: int | None = None


class TaskStatus(WireModel):
    """Who holds the Task and how far it got, written by its responder through the status subresource."""

    phase: str | None = Field(
        default=None,
        description="Responder-reported phase: Pending (queued, not taken yet), Running, WaitingInput (waiting for "
        "a person, e.g. a permission gate); unset until a responder takes the Task.",
    )
    responder: str | None = Field(default=None, description="Who holds the Task, as kind:key (e.g. harness:assistant).")
    started_at: str | None = Field(
        default=None,
        description="When the responder took the Task (RFC 3339).",
        json_schema_extra={"format": "date-time"},
    )
    observed_revision: int | None = Field(default=None, description="Last spec.revision the responder saw.")
    observed_generation: int | None = Field(default=None, description="Last metadata.generation the responder saw.")
    message: str | None = Field(default=None, description="A short human-readable note on the phase.")
    conditions: list[TaskCondition] | None = Field(default=None, description="Observed conditions, if any.")


class Task(KubeObject):
    """A small resource that wakes the chosen responder; its name is the task id."""

    declaration: ClassVar[KindDeclaration] = KindDeclaration(
        group="loopd.dev",
        version="v1alpha1",
        kind="Task",
        plural="tasks",
        singular="task",
        namespaced=True,
        status_subresource=True,
        short_names=("tk",),
        categories=("loopd",),
        printer_columns=(
            PrinterColumn("Target-Kind", "string", ".spec.target.kind", "Responder kind"),
            PrinterColumn("Target", "string", ".spec.target.key", "Responder key"),
            PrinterColumn("Revision", "integer", ".spec.revision", "Wake revision"),
            PrinterColumn("Phase", "string", ".status.phase", "Responder-reported phase"),
            PrinterColumn("Responder", "string", ".status.responder", "Who holds the Task"),
            PrinterColumn("Age", "date", ".metadata.creationTimestamp"),
        ),
        description="A Task wakes one responder (operator or harness) for one question; name = task id.",
    )

    spec: TaskSpec = Field(description="Which responder answers the Task (routing and wake revision only).")
    status: TaskStatus | None = Field(
        default=None, description="Who holds the Task and since when; set by the responder, never by clients."
    )


class LeaseSpec(WireModel):
    holder_identity: str | None = None
    lease_duration_seconds: int | None = None
    acquire_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    renew_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    lease_transitions: int | None = None
    strategy: str | None = None
    preferred_holder: str | None = None


class Lease(KubeObject):
    """``coordination.k8s.io/v1`` Lease, for leader election."""

    declaration: ClassVar[KindDeclaration] = KindDeclaration(
        group="coordination.k8s.io",
        version="v1",
        kind="Lease",
        plural="leases",
        singular="lease",
        namespaced=True,
        spec_required=False,
        printer_columns=(
            PrinterColumn("Holder", "string", ".spec.holderIdentity", "Current holder of the lease"),
            PrinterColumn("Age", "date", ".metadata.creationTimestamp"),
        ),
    )

    spec: LeaseSpec = Field(default_factory=LeaseSpec)


_NAMESPACE = KindSpec(
    group="",
    version="v1",
    kind="Namespace",
    plural="namespaces",
    singular="namespace",
    namespaced=False,
    status_subresource=True,
    short_names=("ns",),
    schema={
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "properties": {"finalizers": {"type": "array", "items": {"type": "string"}}},
            },
            "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
        },
    },
    printer_columns=(
        PrinterColumn("Status", "string", ".status.phase"),
        PrinterColumn("Age", "date", ".metadata.creationTimestamp"),
    ),
)

_CRD = KindSpec(
    group="apiextensions.k8s.io",
    version="v1",
    kind="CustomResourceDefinition",
    plural="customresourcedefinitions",
    singular="customresourcedefinition",
    namespaced=False,
    status_subresource=True,
    short_names=("crd", "crds"),
    categories=("api-extensions",),
    schema={
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
        "required": ["spec"],
    },
    # kube-apiserver's own CRD table (a timestamp, not an age, under Created At); the "@…" paths are computed
    # cells (_api_tables.COMPUTED_CELLS).
    printer_columns=(
        PrinterColumn("Scope", "string", ".spec.scope", "Cluster/Namespaced"),
        PrinterColumn("Versions", "string", "@servedVersions", "Served versions"),
        PrinterColumn("Created At", "string", ".metadata.creationTimestamp"),
        PrinterColumn("Group", "string", ".spec.group", "API group", priority=1),
        PrinterColumn("Kind", "string", ".spec.names.kind", "CustomResource kind", priority=1),
        PrinterColumn("ShortNames", "string", "@shortNames", "Short names", priority=1),
        PrinterColumn("Established", "boolean", "@established", "Established status", priority=1),
    ),
)

#: Typed kinds whose CRD manifests loopd ships (``loopd manifests crds``).
CRD_MODELS: tuple[type[KubeObject], ...] = (Task,)


def builtin_kind_specs() -> list[KindSpec]:
    """Kinds every store serves without any CRD."""
    return [kind_spec_from_model(Task), kind_spec_from_model(Lease), _NAMESPACE, _CRD]


def builtin_crds() -> list[dict[str, Any]]:
    """The CRD manifests generated from loopd's typed kinds."""
    return [crd_from_model(model) for model in CRD_MODELS]
