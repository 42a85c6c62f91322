"""Discovery documents and the minimal OpenAPI v3 documents, built from a ``KindRegistry``.

Owns: ``/version``, legacy discovery (``APIVersions``, ``APIGroupList``, ``APIGroup``, ``APIResourceList``),
aggregated discovery (``apidiscovery.k8s.io`` v2/v2beta1 ``APIGroupDiscoveryList``) and the OpenAPI v3 index and
per-group-version documents kubectl needs for ``apply`` (see reference/kubectl-probe.md).
Must not do: I/O or request handling.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

from ._kinds import KindRegistry, KindSpec

#: kubectl's dispatcher picks the kubectl binary matching this minor version (27–33 are installed).
SERVER_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-loopd",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "go1.23.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}

VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
STATUS_VERBS = ["get", "patch", "update"]
_VERSION_RE = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def _version_priority(version: str) -> tuple[int, int, int]:
    match = _VERSION_RE.match(version)
    if match is None:
        return (3, 0, 0)
    stage = {"None": 0, "beta": 1, "alpha": 2}[str(match.group(2))]
    return (stage, -int(match.group(1)), -int(match.group(3) or 0))


def group_versions(registry: KindRegistry) -> dict[str, list[str]]:
    """Non-core groups and their versions, preferred version first."""
    groups: dict[str, set[str]] = {}
    for spec in registry.kinds():
        if spec.group:
            groups.setdefault(spec.group, set()).add(spec.version)
    return {group: sorted(versions, key=_version_priority) for group, versions in sorted(groups.items())}


def _kinds_at(registry: KindRegistry, group: str, version: str) -> list[KindSpec]:
    return sorted((s for s in registry.kinds() if s.group == group and s.version == version), key=lambda s: s.plural)


# -- legacy discovery ------------------------------------------------------------------------------------------


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _api_group(group: str, versions: list[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def api_group_list(registry: KindRegistry) -> dict[str, Any]:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_api_group(g, v) for g, v in group_versions(registry).items()],
    }


def api_group(registry: KindRegistry, group: str) -> dict[str, Any] | None:
    versions = group_versions(registry).get(group)
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_api_group(group, versions)}


def api_resource_list(registry: KindRegistry, group: str, version: str) -> dict[str, Any] | None:
    specs = _kinds_at(registry, group, version)
    if not specs:
        return None
    resources: list[dict[str, Any]] = []
    for spec in specs:
        entry: dict[str, Any] = {
            "name": spec.plural,
            "singularName": spec.singular,
            "namespaced": spec.namespaced,
            "kind": spec.kind,
            "verbs": VERBS,
        }
        if spec.short_names:
            entry["shortNames"] = list(spec.short_names)
        if spec.categories:
            entry["categories"] = list(spec.categories)
        resources.append(entry)
        if spec.status_subresource:
            resources.append(
                {
                    "name": f"{spec.plural}/status",
                    "singularName": "",
                    "namespaced": spec.namespaced,
                    "kind": spec.kind,
                    "verbs": STATUS_VERBS,
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }


# -- aggregated discovery --------------------------------------------------------------------------------------


def _discovery_resource(spec: KindSpec) -> dict[str, Any]:
    kind_ref = {"group": spec.group, "version": spec.version, "kind": spec.kind}
    entry: dict[str, Any] = {
        "resource": spec.plural,
        "responseKind": kind_ref,
        "scope": "Namespaced" if spec.namespaced else "Cluster",
        "singularResource": spec.singular,
        "verbs": VERBS,
    }
    if spec.short_names:
        entry["shortNames"] = list(spec.short_names)
    if spec.categories:
        entry["categories"] = list(spec.categories)
    if spec.status_subresource:
        entry["subresources"] = [{"subresource": "status", "responseKind": kind_ref, "verbs": STATUS_VERBS}]
    return entry


def aggregated_discovery(registry: KindRegistry, *, core: bool, api_version: str) -> dict[str, Any]:
    """``/api`` (core) or ``/apis`` in ``APIGroupDiscoveryList`` form."""
    items: list[dict[str, Any]] = []
    groups = {"": ["v1"]} if core else group_versions(registry)
    for group, versions in groups.items():
        entries = []
        for version in versions:
            specs = _kinds_at(registry, group, version)
            if specs:
                entries.append(
                    {
                        "version": version,
                        "resources": [_discovery_resource(s) for s in specs],
                        "freshness": "Current",
                    }
                )
        if entries:
            metadata: dict[str, Any] = {"name": group} if group else {"creationTimestamp": None}
            items.append({"metadata": metadata, "versions": entries})
    return {"kind": "APIGroupDiscoveryList", "apiVersion": api_version, "metadata": {}, "items": items}


# -- OpenAPI v3 ------------------------------------------------------------------------------------------------


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _schema_name(spec: KindSpec) -> str:
    reversed_group = ".".join(reversed(spec.group.split("."))) if spec.group else "io.k8s.api.core"
    return f"{reversed_group}.{spec.version}.{spec.kind}"


def _operations(spec: KindSpec, item: bool) -> dict[str, Any]:
    gvk = {"group": spec.group, "version": spec.version, "kind": spec.kind}
    ref = {"$ref": f"#/components/schemas/{_schema_name(spec)}"}
    body = {"content": {"application/json": {"schema": ref}}}
    ok = {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}}
    params = [
        {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
        {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
        {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
    ]

    def operation(action: str, with_body: bool) -> dict[str, Any]:
        op: dict[str, Any] = {
            "operationId": f"{action}{spec.kind}",
            "parameters": params if with_body else [],
            "responses": ok,
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
        }
        if with_body:
            op["requestBody"] = body
        return op

    if item:
        return {
            "get": operation("get", False),
            "put": operation("put", True),
            "patch": operation("patch", True),
            "delete": operation("delete", False),
        }
    return {"get": operation("list", False), "post": operation("post", True)}


_METADATA = "Standard object metadata: name, namespace, labels, annotations, uid, resourceVersion, generation."


def openapi_document(registry: KindRegistry, group: str, version: str) -> dict[str, Any] | None:
    specs = _kinds_at(registry, group, version)
    if not specs:
        return None
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for spec in specs:
        scope = f"{prefix}/namespaces/{{namespace}}/{spec.plural}" if spec.namespaced else f"{prefix}/{spec.plural}"
        paths[scope] = _operations(spec, item=False)
        paths[f"{scope}/{{name}}"] = _operations(spec, item=True)
        if spec.status_subresource:
            paths[f"{scope}/{{name}}/status"] = _operations(spec, item=True)
        schema = dict(spec.schema)
        properties = schema.get("properties")
        if isinstance(properties, dict) and isinstance(properties.get("metadata"), dict):
            # A CRD may not describe metadata; the API's own document does, like Kubernetes' ObjectMeta.
            schema["properties"] = {**properties, "metadata": {"description": _METADATA, **properties["metadata"]}}
        schema["x-kubernetes-group-version-kind"] = [{"group": spec.group, "version": spec.version, "kind": spec.kind}]
        schemas[_schema_name(spec)] = schema
    return {
        "openapi": "3.0.0",
        "info": {"title": "loopd", "version": version},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def _digest(document: Any) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:32].upper()


def openapi_index(registry: KindRegistry) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    pairs: Iterable[tuple[str, str]] = [("", "v1")] + [
        (group, version) for group, versions in group_versions(registry).items() for version in versions
    ]
    for group, version in pairs:
        document = openapi_document(registry, group, version)
        if document is not None:
            path = _gv_path(group, version)
            paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={_digest(document)}"}
    return {"paths": paths}
