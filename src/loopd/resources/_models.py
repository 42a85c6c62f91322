"""Typed object models, and the CRD / ``KindSpec`` generated from them.

Owns: ``ObjectMeta``, ``OwnerReference``, the ``KubeObject`` base, ``KindDeclaration`` (names, scope,
subresources, printer columns of a kind) and ``crd_from_model`` / ``kind_spec_from_model``.
Must not do: I/O; store semantics.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from ._kinds import KindSpec, PrinterColumn
from ._schemas import structural_schema

#: The CEL transition rule that freezes a value once created (``spec`` of a kind with ``immutable_spec``).
IMMUTABLE_RULE: Mapping[str, str] = MappingProxyType({"rule": "self == oldSelf", "message": "spec is immutable"})


class WireModel(BaseModel):
    """Base of every wire model: camelCase on the wire, snake_case in Python, unknown fields kept."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class OwnerReference(WireModel):
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(WireModel):
    name: str | None = None
    generate_name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    owner_references: list[OwnerReference] | None = None
    finalizers: list[str] | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None


@dataclass(frozen=True)
class KindDeclaration:
    """How a typed model is served: names, scope, subresources, printer columns."""

    group: str
    version: str
    kind: str
    plural: str
    singular: str = ""
    namespaced: bool = True
    status_subresource: bool = False
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    printer_columns: tuple[PrinterColumn, ...] = ()
    spec_required: bool = True
    description: str = ""
    #: Make ``spec`` immutable: ``x-kubernetes-validations: [{rule: "self == oldSelf"}]`` on the spec schema,
    #: enforced by the embedded API (and a real kube-apiserver) on every update and patch.
    immutable_spec: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


class KubeObject(WireModel):
    """Base of typed objects; subclasses set ``declaration`` and declare ``spec`` (and ``status``)."""

    declaration: ClassVar[KindDeclaration]

    api_version: str = ""
    kind: str = ""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)

    def model_post_init(self, context: Any, /) -> None:
        if not self.api_version:
            self.api_version = self.declaration.api_version
        if not self.kind:
            self.kind = self.declaration.kind

    def to_object(self) -> dict[str, Any]:
        """The JSON-shaped dict the store and API take."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    @classmethod
    def from_object(cls, obj: Any) -> Self:
        return cls.model_validate(obj)


def _object_schema(model: type[KubeObject]) -> dict[str, Any]:
    declaration = model.declaration
    properties: dict[str, Any] = {
        "apiVersion": {"type": "string", "description": "The schema version of this object: group/version."},
        "kind": {"type": "string", "description": "The kind of this object."},
        "metadata": {"type": "object"},  # a CRD may say nothing else about it (the API describes it: discovery)
    }
    required: list[str] = []
    for field_name in ("spec", "status"):
        info = model.model_fields.get(field_name)
        if info is None or info.annotation is None:
            continue
        sub = _field_model(info.annotation)
        properties[field_name] = structural_schema(sub.model_json_schema(by_alias=True, mode="validation"))
        if info.description:  # what the field means here wins over the model's own docstring
            properties[field_name]["description"] = info.description
        if field_name == "spec" and declaration.immutable_spec:
            properties[field_name]["x-kubernetes-validations"] = [dict(IMMUTABLE_RULE)]
        if field_name == "spec" and declaration.spec_required and info.is_required():
            required.append("spec")
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if declaration.description:
        schema["description"] = declaration.description
    if required:
        schema["required"] = required
    return schema


def _field_model(annotation: Any) -> type[BaseModel]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    raise TypeError(f"spec/status must be pydantic models, got {annotation!r}")


def kind_spec_from_model(model: type[KubeObject]) -> KindSpec:
    d = model.declaration
    return KindSpec(
        group=d.group,
        version=d.version,
        kind=d.kind,
        plural=d.plural,
        singular=d.singular or d.kind.lower(),
        namespaced=d.namespaced,
        status_subresource=d.status_subresource,
        short_names=d.short_names,
        categories=d.categories,
        schema=_object_schema(model),
        printer_columns=d.printer_columns,
    )


def crd_from_model(model: type[KubeObject]) -> dict[str, Any]:
    """The ``apiextensions.k8s.io/v1`` CustomResourceDefinition for a typed kind."""
    d = model.declaration
    names: dict[str, Any] = {
        "kind": d.kind,
        "listKind": f"{d.kind}List",
        "plural": d.plural,
        "singular": d.singular or d.kind.lower(),
    }
    if d.short_names:
        names["shortNames"] = list(d.short_names)
    if d.categories:
        names["categories"] = list(d.categories)
    version: dict[str, Any] = {
        "name": d.version,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": _object_schema(model)},
    }
    if d.status_subresource:
        version["subresources"] = {"status": {}}
    if d.printer_columns:
        version["additionalPrinterColumns"] = [column.to_crd() for column in d.printer_columns]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{d.plural}.{d.group}"},
        "spec": {
            "group": d.group,
            "names": names,
            "scope": "Namespaced" if d.namespaced else "Cluster",
            "versions": [version],
        },
    }
