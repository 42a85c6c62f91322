"""CEL transition rules (``x-kubernetes-validations: self == oldSelf``): enforced on every write path of every
backend the way kube-apiserver words it; CRDs with rules outside the evaluated subset are refused."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from loopd.resources import CRD_KIND, Invalid, KindRef, ResourceStore

GADGET = KindRef("example.com/v1", "Gadget")


def gadget_crd(
    *, spec_rules: list[dict[str, Any]] | None = None, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    spec_schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "size": {"type": "integer", "default": 1},
            "owner": {"type": "string", "x-kubernetes-validations": [{"rule": "self==oldSelf"}]},
            "labels": {"type": "array", "items": {"type": "string"}},
        },
    }
    if spec_rules is not None:
        spec_schema["x-kubernetes-validations"] = spec_rules
    if extra:
        spec_schema["properties"].update(extra)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Gadget", "plural": "gadgets"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": spec_schema,
                                "status": {
                                    "type": "object",
                                    "properties": {
                                        "phase": {"type": "string"},
                                        "claim": {
                                            "type": "string",
                                            "x-kubernetes-validations": [
                                                {"rule": "oldSelf == self", "message": "claim is final"}
                                            ],
                                        },
                                    },
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


IMMUTABLE = [{"rule": "self == oldSelf", "message": "spec is immutable"}]


def gadget(name: str = "g1", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": name}, "spec": spec}


async def test_immutable_spec_refuses_update_and_patch_like_kube_apiserver(store: ResourceStore) -> None:
    await store.create(CRD_KIND, gadget_crd(spec_rules=IMMUTABLE))
    created = await store.create(GADGET, gadget(size=2))
    assert created["spec"] == {"size": 2}

    same = copy.deepcopy(created)
    same["metadata"]["labels"] = {"a": "b"}  # metadata may change; the spec stays equal
    updated = await store.update(GADGET, same)
    assert updated["metadata"]["labels"] == {"a": "b"}
    # A spec equal after defaulting is the same spec (size defaults to 1 on both sides).
    await store.create(GADGET, gadget("g2"))
    await store.update(GADGET, gadget("g2"))

    changed = copy.deepcopy(updated)
    changed["spec"]["size"] = 3
    with pytest.raises(Invalid) as caught:
        await store.update(GADGET, changed)
    error = caught.value
    # kube-apiserver's words: an object's value is omitted, a scalar's shown (checked against it in tests/conformance).
    assert error.message == 'Gadget.example.com "g1" is invalid: spec: Invalid value: spec is immutable'
    assert [(c.reason, c.field, c.message) for c in error.causes] == [
        ("FieldValueInvalid", "spec", "Invalid value: spec is immutable")
    ]
    assert error.to_status()["code"] == 422
    for patch_type, patch in (
        ("merge", {"spec": {"size": 4}}),
        ("json", [{"op": "replace", "path": "/spec/size", "value": 4}]),
        ("apply", {"apiVersion": "example.com/v1", "kind": "Gadget", "spec": {"size": 4}}),
    ):
        with pytest.raises(Invalid, match="spec is immutable"):
            await store.patch(GADGET, "g1", patch, patch_type=patch_type)  # type: ignore[arg-type]
    assert (await store.get(GADGET, "g1"))["spec"] == {"size": 2}
    # The status subresource writes status only, so the spec rule holds; a dry run is refused the same way.
    await store.patch(GADGET, "g1", {"status": {"phase": "Ready"}}, subresource="status")
    del changed["metadata"]["resourceVersion"]
    with pytest.raises(Invalid):
        await store.update(GADGET, changed, dry_run=True)


async def test_field_rule_applies_once_the_field_has_a_value(store: ResourceStore) -> None:
    await store.create(CRD_KIND, gadget_crd())
    await store.create(GADGET, gadget(size=1))
    # No old value: the transition rule does not run (kube-apiserver semantics), so a first value is accepted.
    await store.patch(GADGET, "g1", {"spec": {"owner": "ann"}})
    await store.patch(GADGET, "g1", {"spec": {"size": 5}})  # other fields stay mutable
    with pytest.raises(Invalid) as caught:
        await store.patch(GADGET, "g1", {"spec": {"owner": "bob"}})
    assert [(c.field, c.message) for c in caught.value.causes] == [
        ("spec.owner", 'Invalid value: "bob": failed rule: self == oldSelf')
    ]
    # Removing the value is not a transition the rule sees (no new value), as in Kubernetes.
    await store.patch(GADGET, "g1", {"spec": {"owner": None}})


async def test_status_rules_are_enforced_on_status_writes(store: ResourceStore) -> None:
    await store.create(CRD_KIND, gadget_crd())
    await store.create(GADGET, gadget())
    await store.patch(GADGET, "g1", {"status": {"claim": "x"}}, subresource="status")
    with pytest.raises(Invalid, match=re.escape('status.claim: Invalid value: "y": claim is final')):
        await store.patch(GADGET, "g1", {"status": {"claim": "y"}}, subresource="status")
    current = await store.get(GADGET, "g1")
    current["status"]["claim"] = "z"
    with pytest.raises(Invalid, match="claim is final"):
        await store.update_status(GADGET, current)


REFUSED_RULES: list[tuple[list[dict[str, Any]] | None, dict[str, Any] | None, str, str]] = [
    (
        [{"rule": "self.size > 0"}],
        None,
        "spec.x-kubernetes-validations[0].rule",
        'Unsupported value: "self.size > 0"',
    ),
    ([{"message": "m"}], None, "spec.x-kubernetes-validations[0].rule", "Required value"),
    (
        [{"rule": "self == oldSelf", "messageExpression": "'no'"}],
        None,
        "spec.x-kubernetes-validations[0].messageExpression",
        "not supported",
    ),
    (
        [{"rule": "self == oldSelf", "optionalOldSelf": True}],
        None,
        "spec.x-kubernetes-validations[0].optionalOldSelf",
        "not supported",
    ),
    (
        [{"rule": "self == oldSelf", "reason": "Nope"}],
        None,
        "spec.x-kubernetes-validations[0].reason",
        "Unsupported value",
    ),
    (
        None,
        {"tags": {"type": "array", "items": {"type": "string", "x-kubernetes-validations": IMMUTABLE}}},
        "spec.properties[tags].items.x-kubernetes-validations[0].rule",
        "only at nodes reached through properties",
    ),
]


async def test_rules_outside_the_evaluated_subset_make_the_crd_invalid(store: ResourceStore) -> None:
    prefix = "spec.versions[0].schema.openAPIV3Schema.properties["
    for rules, extra, field, fragment in REFUSED_RULES:
        with pytest.raises(Invalid) as caught:
            await store.create(CRD_KIND, gadget_crd(spec_rules=rules, extra=extra))
        fields = {c.field: c.message for c in caught.value.causes}
        wanted = prefix + field.replace("spec.", "spec].", 1)
        assert wanted in fields, fields
        assert fragment in fields[wanted]
        with pytest.raises(Exception, match="not found"):
            await store.get(CRD_KIND, "gadgets.example.com")


async def test_a_rule_with_its_own_reason_reports_it(store: ResourceStore) -> None:
    await store.create(CRD_KIND, gadget_crd(spec_rules=[{"rule": "self == oldSelf", "reason": "FieldValueForbidden"}]))
    await store.create(GADGET, gadget(size=1))
    with pytest.raises(Invalid) as caught:
        await store.patch(GADGET, "g1", {"spec": {"size": 2}})
    assert [(c.reason, c.message) for c in caught.value.causes] == [
        ("FieldValueForbidden", "Forbidden: failed rule: self == oldSelf")
    ]
