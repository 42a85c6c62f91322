"""Store contract, part 2: finalizers, owner-reference cascade, CRD registration (SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest

from loopd.resources import (
    CRD_KIND,
    LEASE_KIND,
    TASK_KIND,
    Forbidden,
    Invalid,
    KindRef,
    NotFound,
    ResourceStore,
)
from tests.resources.helpers import lease, owner_ref, rv, task

WIDGET = KindRef("example.com/v1", "Widget")


def widget_crd(*, scope: str = "Namespaced") -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "scope": scope,
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
                                "spec": {
                                    "type": "object",
                                    "required": ["size"],
                                    "properties": {"size": {"type": "integer", "minimum": 1}},
                                },
                                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            },
                        }
                    },
                }
            ],
        },
    }


async def test_finalizers_hold_deletion_until_removed(store: ResourceStore) -> None:
    await store.create(TASK_KIND, task("t1", finalizers=["loopd.dev/cleanup"]))
    marked = await store.delete(TASK_KIND, "t1")
    assert marked["metadata"]["deletionTimestamp"]
    assert (await store.get(TASK_KIND, "t1"))["metadata"]["deletionTimestamp"] == marked["metadata"][
        "deletionTimestamp"
    ]
    again = await store.delete(TASK_KIND, "t1")  # deleting again changes nothing
    assert again["metadata"]["resourceVersion"] == marked["metadata"]["resourceVersion"]
    with pytest.raises(Invalid) as forbidden:
        await store.patch(TASK_KIND, "t1", {"metadata": {"finalizers": ["loopd.dev/cleanup", "new"]}})
    assert forbidden.value.causes[0].field == "metadata.finalizers"
    status_update = await store.patch(TASK_KIND, "t1", {"status": {"phase": "Cleaning"}}, subresource="status")
    assert status_update["metadata"]["deletionTimestamp"]
    await store.patch(TASK_KIND, "t1", {"metadata": {"finalizers": None}})
    with pytest.raises(NotFound):
        await store.get(TASK_KIND, "t1")


async def test_owner_reference_cascade(store: ResourceStore) -> None:
    owner = await store.create(TASK_KIND, task("owner"))
    other = await store.create(TASK_KIND, task("other"))
    await store.create(LEASE_KIND, lease("only-child", ownerReferences=[owner_ref(owner)]))
    await store.create(TASK_KIND, task("grandchild-owner", ownerReferences=[owner_ref(owner)]))
    shared = await store.create(LEASE_KIND, lease("shared", ownerReferences=[owner_ref(owner), owner_ref(other)]))
    child = await store.get(TASK_KIND, "grandchild-owner")
    await store.create(LEASE_KIND, lease("grandchild", ownerReferences=[owner_ref(child)]))

    await store.delete(TASK_KIND, "owner")

    for kind, name in ((LEASE_KIND, "only-child"), (TASK_KIND, "grandchild-owner"), (LEASE_KIND, "grandchild")):
        with pytest.raises(NotFound):
            await store.get(kind, name)
    survivor = await store.get(LEASE_KIND, "shared")
    assert survivor["metadata"]["ownerReferences"] == [owner_ref(other)]
    assert rv(survivor) > rv(shared)


async def test_the_owner_index_follows_every_update_of_an_objects_owners(store: ResourceStore) -> None:
    """Owners added, kept through unrelated updates (their index rows are not rewritten), and removed: the cascade
    follows what the object says now."""
    first = await store.create(TASK_KIND, task("first"))
    second = await store.create(TASK_KIND, task("second"))
    await store.create(LEASE_KIND, lease("child"))
    await store.patch(LEASE_KIND, "child", {"metadata": {"ownerReferences": [owner_ref(first)]}})
    await store.patch(LEASE_KIND, "child", {"metadata": {"labels": {"unrelated": "change"}}})  # owners unchanged
    await store.patch(LEASE_KIND, "child", {"metadata": {"ownerReferences": [owner_ref(second)]}})
    await store.delete(TASK_KIND, "first")
    assert await store.get(LEASE_KIND, "child")  # no longer its owner
    await store.patch(LEASE_KIND, "child", {"metadata": {"annotations": {"still": "owned"}}})  # owners unchanged
    await store.delete(TASK_KIND, "second")
    with pytest.raises(NotFound):
        await store.get(LEASE_KIND, "child")


async def test_orphan_propagation_keeps_dependents(store: ResourceStore) -> None:
    owner = await store.create(TASK_KIND, task("owner"))
    await store.create(LEASE_KIND, lease("child", ownerReferences=[owner_ref(owner)]))
    await store.delete(TASK_KIND, "owner", propagation_policy="Orphan")
    child = await store.get(LEASE_KIND, "child")
    assert "ownerReferences" not in child["metadata"]


async def test_cascade_waits_for_owner_finalizers(store: ResourceStore) -> None:
    owner = await store.create(TASK_KIND, task("owner", finalizers=["hold"]))
    await store.create(LEASE_KIND, lease("child", ownerReferences=[owner_ref(owner)]))
    await store.delete(TASK_KIND, "owner")
    assert await store.get(LEASE_KIND, "child")  # owner still terminating
    await store.patch(TASK_KIND, "owner", {"metadata": {"finalizers": []}})
    with pytest.raises(NotFound):
        await store.get(LEASE_KIND, "child")


async def test_crd_registers_a_kind_with_schema_validation(store: ResourceStore) -> None:
    with pytest.raises(NotFound):
        store.registry.get(WIDGET)
    crd = await store.create(CRD_KIND, widget_crd())
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert store.registry.get(WIDGET).plural == "widgets"
    created = await store.create(WIDGET, {"metadata": {"name": "w1"}, "spec": {"size": 2}})
    assert created["apiVersion"] == "example.com/v1"
    with pytest.raises(Invalid) as invalid:
        await store.create(WIDGET, {"metadata": {"name": "w2"}, "spec": {"size": 0}})
    assert invalid.value.causes[0].field == "spec.size"
    await store.delete(CRD_KIND, "widgets.example.com")
    with pytest.raises(NotFound):
        store.registry.get(WIDGET)


async def test_deleting_a_crd_deletes_its_objects(open_store: Any) -> None:
    store: ResourceStore = await open_store()
    await store.create(CRD_KIND, widget_crd())
    await store.create(WIDGET, {"metadata": {"name": "w1"}, "spec": {"size": 2}})
    await store.delete(CRD_KIND, "widgets.example.com")
    await store.create(CRD_KIND, widget_crd())
    assert (await store.list(WIDGET)).items == []


async def test_crds_survive_reopen_and_reach_other_stores(open_store: Any) -> None:
    first: ResourceStore = await open_store()
    await first.create(CRD_KIND, widget_crd())
    second: ResourceStore = await open_store()
    assert second.registry.get(WIDGET).kind == "Widget"


async def test_invalid_crd_names_fields(store: ResourceStore) -> None:
    bad = widget_crd()
    bad["metadata"]["name"] = "wrong"
    bad["spec"]["scope"] = "Galaxy"
    del bad["spec"]["versions"][0]["schema"]
    with pytest.raises(Invalid) as invalid:
        await store.create(CRD_KIND, bad)
    fields = {cause.field for cause in invalid.value.causes}
    assert fields == {"metadata.name", "spec.scope", "spec.versions[0].schema.openAPIV3Schema"}


async def test_builtin_crd_is_seeded_and_protected(store: ResourceStore) -> None:
    crd = await store.get(CRD_KIND, "tasks.loopd.dev")
    assert crd["spec"]["names"]["kind"] == "Task"
    with pytest.raises(Forbidden):
        await store.delete(CRD_KIND, "tasks.loopd.dev")
