"""Pure object-state transitions: what a create, update or status update turns an object into.

Owns: input normalization, namespace resolution, server-set metadata on create, the update rules (immutable
fields, status subresource, finalizers during deletion, generation bumps), preconditions, kind-specific rules
(Namespace phase, CRD status) and continue tokens. Must not do: I/O, clocks or randomness beyond the name suffix
(time comes in as ``now``); the engine runs these inside its transactions.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets
from collections.abc import Mapping
from typing import Any

from loopd._infra.jsoncopy import json_copy

from ._crds import kind_specs_from_crd
from ._errors import BadRequest, Cause, Conflict, ErrorDetails, Invalid, NotFound
from ._kinds import KindSpec
from ._rules import transition_causes
from ._sql import ObjectKey
from ._validation import invalid_error, validate_object

CRD_STORAGE = ("apiextensions.k8s.io", "customresourcedefinitions")
NAMESPACE_STORAGE = ("", "namespaces")
_SYSTEM_METADATA = (
    "uid",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "resourceVersion",
    "managedFields",
    "selfLink",
)
_NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def metadata_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def rv_of(obj: Mapping[str, Any]) -> str:
    return str(metadata_of(obj).get("resourceVersion", ""))


def _spec_part(obj: Mapping[str, Any], *, include_status: bool) -> dict[str, Any]:
    skipped = {"metadata", "apiVersion", "kind"} if include_status else {"metadata", "apiVersion", "kind", "status"}
    return {k: v for k, v in obj.items() if k not in skipped}


def resolve_namespace(spec: KindSpec, in_body: Any, in_request: str | None) -> str:
    if not spec.namespaced:
        return ""
    if in_body not in (None, "") and in_request not in (None, "") and in_body != in_request:
        raise BadRequest("the namespace of the provided object does not match the namespace sent on the request")
    namespace = str(in_request or in_body or "default")
    if len(namespace) > 63 or not _DNS_LABEL.match(namespace):
        raise BadRequest(f"invalid namespace {namespace!r}")
    return namespace


def object_key(spec: KindSpec, namespace: str, name: str) -> ObjectKey:
    if not name:
        raise BadRequest("a resource name is required")
    return (spec.group, spec.plural, namespace if spec.namespaced else "", name)


def not_found(spec: KindSpec, name: str) -> NotFound:
    return NotFound(f'{spec.qualified_resource} "{name}" not found', details=spec.details(name))


def normalize_input(spec: KindSpec, obj: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(obj, Mapping):
        raise BadRequest("the object must be a JSON object")
    try:
        body: dict[str, Any] = json.loads(json.dumps(obj))
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"the object is not JSON-serializable: {exc}") from exc
    api_version = body.get("apiVersion")
    if api_version not in (None, "") and api_version != spec.api_version:
        raise BadRequest(
            f"the API version in the data ({api_version}) does not match the expected API version ({spec.api_version})"
        )
    kind = body.get("kind")
    if kind not in (None, "") and kind != spec.kind:
        cause = Cause("FieldValueInvalid", f"Invalid value: {json.dumps(kind)}: must be {spec.kind}", "kind")
        name = str(metadata_of(body).get("name", ""))
        group = f".{spec.group}" if spec.group else ""
        raise Invalid(  # as kube-apiserver: named after the kind the body claims
            f'{kind}{group} "{name}" is invalid: kind: {cause.message}',
            causes=(cause,),
            details=ErrorDetails(name=name, group=spec.group, kind=str(kind)),
        )
    body["apiVersion"], body["kind"] = spec.api_version, spec.kind
    metadata = body.get("metadata")
    if metadata is None:
        body["metadata"] = {}
    elif not isinstance(metadata, dict):
        raise BadRequest("metadata must be a JSON object")
    return body


def prepare_create(
    spec: KindSpec, obj: Mapping[str, Any], namespace: str | None, *, strict: bool, now: str
) -> tuple[ObjectKey, dict[str, Any]]:
    body = normalize_input(spec, obj)
    meta = body["metadata"]
    if meta.get("resourceVersion"):
        raise BadRequest("resourceVersion should not be set on objects to be created")
    ns = resolve_namespace(spec, meta.get("namespace"), namespace)
    if not meta.get("name") and isinstance(meta.get("generateName"), str) and meta["generateName"]:
        suffix = "".join(secrets.choice(_NAME_SUFFIX_ALPHABET) for _ in range(5))
        meta["name"] = f"{meta['generateName']}{suffix}"
    for key in _SYSTEM_METADATA:
        meta.pop(key, None)
    if ns:
        meta["namespace"] = ns
    else:
        meta.pop("namespace", None)
    if spec.status_subresource:
        body.pop("status", None)
    body = validate_object(spec, body, strict=strict)
    body = apply_kind_rules(spec, body, now)
    return object_key(spec, ns, str(body["metadata"]["name"])), body


def compose_update(
    spec: KindSpec, existing: dict[str, Any], body: dict[str, Any], *, strict: bool, now: str
) -> dict[str, Any]:
    new = json_copy(body)
    new["apiVersion"], new["kind"] = spec.api_version, spec.kind
    meta = new.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise BadRequest("metadata must be a JSON object")
    old_meta = metadata_of(existing)
    for key in ("name", "namespace"):
        if meta.get(key) not in (None, "", old_meta.get(key)):
            raise BadRequest(f"metadata.{key} may not be changed")
    for key in (*_SYSTEM_METADATA, "name", "namespace"):
        meta.pop(key, None)
        if key in old_meta and key != "resourceVersion":
            meta[key] = old_meta[key]
    if spec.status_subresource:
        new.pop("status", None)
        if "status" in existing:
            new["status"] = json_copy(existing["status"])
    new = validate_object(spec, new, strict=strict)
    new = apply_kind_rules(spec, new, now)
    new_meta = new["metadata"]
    if old_meta.get("deletionTimestamp"):
        added = set(new_meta.get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
        if added:
            raise invalid_error(
                spec,
                str(old_meta.get("name", "")),
                [
                    Cause(
                        "FieldValueForbidden",
                        "Forbidden: no new finalizers can be added if the object is being deleted, "
                        f"found new finalizers []string{{{', '.join(json.dumps(f) for f in sorted(added))}}}",
                        "metadata.finalizers",
                    )
                ],
            )
    check_transition_rules(spec, existing, new)
    include_status = not spec.status_subresource
    if _spec_part(new, include_status=include_status) != _spec_part(existing, include_status=include_status):
        new_meta["generation"] = int(old_meta.get("generation", 1)) + 1
    return new


def compose_status(spec: KindSpec, existing: dict[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    new = json_copy(existing)
    new["apiVersion"] = spec.api_version
    status = body.get("status")
    if status is None:
        new.pop("status", None)
    else:
        new["status"] = json_copy(status)
    new = validate_object(spec, new, status_write=True)
    check_transition_rules(spec, existing, new)
    return new


def check_transition_rules(spec: KindSpec, existing: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """Raise ``Invalid`` when a write breaks a transition rule (``self == oldSelf``) of the kind's schema."""
    causes = transition_causes(spec.schema, existing, new)
    if causes:
        raise invalid_error(spec, str(metadata_of(existing).get("name", "")), causes)


def apply_kind_rules(spec: KindSpec, body: dict[str, Any], now: str) -> dict[str, Any]:
    if spec.storage_key == NAMESPACE_STORAGE:
        body.setdefault("spec", {})
        body["status"] = {"phase": "Terminating" if metadata_of(body).get("deletionTimestamp") else "Active"}
    elif spec.storage_key == CRD_STORAGE:
        specs = kind_specs_from_crd(body)
        body["status"] = _crd_status(body, specs, now)
    return body


def check_preconditions(spec: KindSpec, existing: dict[str, Any], rv: Any, uid: Any) -> None:
    name = str(metadata_of(existing).get("name", ""))
    if rv not in (None, "") and str(rv) != rv_of(existing):
        raise Conflict(
            f'Operation cannot be fulfilled on {spec.qualified_resource} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again",
            details=spec.details(name),
        )
    if uid not in (None, "") and str(uid) != str(metadata_of(existing).get("uid", "")):
        current_uid = metadata_of(existing).get("uid")
        raise Conflict(
            f"Precondition failed: UID in precondition: {uid}, UID in object meta: {current_uid}",
            details=spec.details(name),
        )


def owner_uids(body: Mapping[str, Any]) -> list[str]:
    refs = metadata_of(body).get("ownerReferences") or []
    return [str(ref["uid"]) for ref in refs if isinstance(ref, dict) and ref.get("uid")]


def _crd_status(crd: Mapping[str, Any], specs: list[KindSpec], now: str) -> dict[str, Any]:
    crd_spec = crd.get("spec") or {}
    names = dict(crd_spec.get("names") or {})
    names.setdefault("singular", str(names.get("kind", "")).lower())
    names.setdefault("listKind", f"{names.get('kind', '')}List")
    storage = [str(v.get("name")) for v in crd_spec.get("versions") or [] if v.get("storage") is True]
    conditions = [
        {"type": kind, "status": "True", "reason": reason, "message": message, "lastTransitionTime": now}
        for kind, reason, message in (
            ("NamesAccepted", "NoConflicts", "no conflicts found"),
            ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        )
    ]
    previous = crd.get("status") or {}
    if isinstance(previous, dict) and previous.get("conditions"):
        conditions = previous["conditions"]
    return {"acceptedNames": names, "conditions": conditions, "storedVersions": storage}


def encode_continue(namespace: str, name: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([namespace, name]).encode()).decode()


def decode_continue(token: str) -> tuple[str, str]:
    try:
        namespace, name = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, TypeError, binascii.Error) as exc:
        raise BadRequest("invalid continue token") from exc
    return str(namespace), str(name)
