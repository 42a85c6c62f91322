"""Value types every resource client speaks: which resource a call is about, and object accessors.

Owns: ``ResourceType`` (group, version, kind, plural, scope, status subresource) and the well-known resource
types ``TASKS`` and ``LEASES``; small read-only helpers over Kubernetes-shaped objects.
Must not do: I/O, or hold state.

Objects themselves are plain JSON-shaped ``dict[str, Any]`` (Kubernetes wire form), the same shape the store,
the HTTP API and real clusters use; ``ObjectList`` and ``WatchEvent`` are the store's own value types.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from loopd.resources import KindRef

JsonObject = dict[str, Any]
PatchType = Literal["merge", "json"]


@dataclass(frozen=True, slots=True)
class ResourceType:
    """Which REST resource a call is about.

    A client needs the plural (the URL path segment) and the scope, not just ``apiVersion``/``kind``, so that
    it never has to run discovery: the same value works against the embedded API and a real cluster.
    """

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True
    status_subresource: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def ref(self) -> KindRef:
        """The store's name for this kind."""
        return KindRef(self.api_version, self.kind)

    @property
    def qualified_name(self) -> str:
        """``tasks.loopd.dev``, as Kubernetes messages name a resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def __str__(self) -> str:
        return self.qualified_name


TASKS = ResourceType("loopd.dev", "v1alpha1", "Task", "tasks")
"""Tasks: namespaced, with a status subresource (DESIGN §4)."""

TASK_TARGET_KIND_LABEL: Final = "loopd.dev/target-kind"
"""The label naming who a Task is for: ``harness`` or ``operator`` (its ``spec.target.kind``)."""

TASK_TARGET_KEY_LABEL: Final = "loopd.dev/target-key"
"""The label holding a Task's ``spec.target.key`` (absent when the key is not a valid label value)."""

_LABEL_VALUE: Final = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def task_target_labels(kind: str, key: str) -> dict[str, str]:
    """The labels a Task addressed to ``kind:key`` carries, so that a watch can select only its own Tasks on the
    server (``loopd.dev/target-kind!=harness``: operators never receive the chats' Tasks). A part that is not a
    valid Kubernetes label value (63 characters of ``[-A-Za-z0-9_.]``, alphanumeric at both ends) is left out."""
    labels: dict[str, str] = {}
    if kind and _LABEL_VALUE.fullmatch(kind):
        labels[TASK_TARGET_KIND_LABEL] = kind
    if key and _LABEL_VALUE.fullmatch(key):
        labels[TASK_TARGET_KEY_LABEL] = key
    return labels


def tasks_not_for(kind: str) -> str:
    """A label selector for every Task not addressed to ``kind``, including Tasks without the label (created
    before Tasks carried it, or by hand): ``!=`` matches an absent label, in Kubernetes and the embedded API."""
    return f"{TASK_TARGET_KIND_LABEL}!={kind}"


LEASES = ResourceType("coordination.k8s.io", "v1", "Lease", "leases", status_subresource=False)
"""Leases used for leader election: namespaced, no status subresource."""


def metadata_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def name_of(obj: Mapping[str, Any]) -> str:
    return str(metadata_of(obj).get("name") or "")


def namespace_of(obj: Mapping[str, Any]) -> str | None:
    namespace = metadata_of(obj).get("namespace")
    return str(namespace) if namespace else None


def resource_version_of(obj: Mapping[str, Any]) -> str:
    return str(metadata_of(obj).get("resourceVersion") or "")
