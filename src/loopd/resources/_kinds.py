"""Kind identities and the per-store kind registry.

Owns: ``KindRef`` (what a caller names), ``KindSpec`` (everything the store and API know about a served kind),
``KindRegistry`` (built-in kinds plus kinds registered from CustomResourceDefinitions).
Must not do: I/O, validation of objects, or CRD parsing (see ``_crds``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._errors import ErrorDetails, NotFound


@dataclass(frozen=True)
class KindRef:
    """Names a kind the way objects do: ``apiVersion`` + ``kind``."""

    api_version: str
    kind: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    def __str__(self) -> str:
        return f"{self.api_version}/{self.kind}"


@dataclass(frozen=True)
class PrinterColumn:
    """One ``additionalPrinterColumns`` entry."""

    name: str
    type: str
    json_path: str
    description: str = ""
    priority: int = 0
    format: str = ""

    def to_crd(self) -> dict[str, Any]:
        column: dict[str, Any] = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.description:
            column["description"] = self.description
        if self.priority:
            column["priority"] = self.priority
        if self.format:
            column["format"] = self.format
        return column


@dataclass(frozen=True)
class KindSpec:
    """A served kind at one version."""

    group: str
    version: str
    kind: str
    plural: str
    singular: str
    namespaced: bool
    status_subresource: bool = False
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    schema: Mapping[str, Any] = field(default_factory=dict)
    printer_columns: tuple[PrinterColumn, ...] = ()
    list_kind: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def ref(self) -> KindRef:
        return KindRef(self.api_version, self.kind)

    @property
    def qualified_resource(self) -> str:
        """``tasks.loopd.dev`` (``namespaces`` for the core group), as Kubernetes error messages name it."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def storage_key(self) -> tuple[str, str]:
        """Objects are stored per (group, plural), whatever version they were written at."""
        return (self.group, self.plural)

    @property
    def list_kind_name(self) -> str:
        return self.list_kind or f"{self.kind}List"

    def details(self, name: str = "") -> ErrorDetails:
        return ErrorDetails(name=name, group=self.group, kind=self.plural)


class KindRegistry:
    """The kinds one store serves: fixed built-ins plus kinds added by CRD objects.

    Built-in kinds cannot be replaced by a CRD of the same name; the CRD object is stored but the built-in
    definition stays authoritative.
    """

    def __init__(self, builtins: Iterable[KindSpec]) -> None:
        self._builtins: tuple[KindSpec, ...] = tuple(builtins)
        self._from_crds: dict[str, tuple[KindSpec, ...]] = {}
        self._index: dict[tuple[str, str, str], KindSpec] = {}
        self._by_kind: dict[tuple[str, str, str], KindSpec] = {}
        self._reindex()

    def get(self, ref: KindRef) -> KindSpec:
        spec = self._by_kind.get((ref.group, ref.version, ref.kind))
        if spec is None:
            raise NotFound(f"the server could not find the requested resource (kind {ref})")
        return spec

    def by_resource(self, group: str, version: str, plural: str) -> KindSpec:
        spec = self._index.get((group, version, plural))
        if spec is None:
            raise NotFound(
                "the server could not find the requested resource",
                details=ErrorDetails(group=group, kind=plural),
            )
        return spec

    def kinds(self) -> list[KindSpec]:
        return list(self._index.values())

    def is_builtin(self, group: str, plural: str) -> bool:
        return any(spec.group == group and spec.plural == plural for spec in self._builtins)

    def storage_specs(self, group: str, plural: str) -> list[KindSpec]:
        return [spec for spec in self._index.values() if spec.storage_key == (group, plural)]

    def register(self, crd_name: str, specs: Iterable[KindSpec]) -> None:
        """Add or replace the kinds of one CRD (ignored for built-in kinds)."""
        accepted = tuple(spec for spec in specs if not self.is_builtin(spec.group, spec.plural))
        if accepted:
            self._from_crds[crd_name] = accepted
        else:
            self._from_crds.pop(crd_name, None)
        self._reindex()

    def unregister(self, crd_name: str) -> tuple[KindSpec, ...]:
        removed = self._from_crds.pop(crd_name, ())
        self._reindex()
        return removed

    def _reindex(self) -> None:
        index: dict[tuple[str, str, str], KindSpec] = {}
        by_kind: dict[tuple[str, str, str], KindSpec] = {}
        for spec in (*self._builtins, *(s for specs in self._from_crds.values() for s in specs)):
            index.setdefault((spec.group, spec.version, spec.plural), spec)
            by_kind.setdefault((spec.group, spec.version, spec.kind), spec)
        self._index = index
        self._by_kind = by_kind
