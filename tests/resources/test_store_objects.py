"""Store contract, part 1: object writes and reads (runs on SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from loopd.resources import (
    LEASE_KIND,
    NAMESPACE_KIND,
    TASK_KIND,
    AlreadyExists,
    BadRequest,
    Conflict,
    Invalid,
    NotFound,
    ResourceStore,
    StoreUnavailable,
)
from tests.resources.helpers import lease, rv, task


async def test_create_fills_server_metadata_and_get_returns_it(store: ResourceStore) -> None:
    created = await store.create(TASK_KIND, task("t1", labels={"app": "x"}))
    meta = created["metadata"]
    assert meta["namespace"] == "default"
    assert meta["generation"] == 1
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert int(meta["resourceVersion"]) > 0
    assert created["spec"] == {"target": {"kind": "operator", "key": "router"}, "revision": 1}  # defaulted
    assert await store.get(TASK_KIND, "t1") == created
    assert (await store.get(TASK_KIND, "t1", namespace="default"))["metadata"]["uid"] == meta["uid"]


async def test_create_twice_is_already_exists_and_missing_is_not_found(store: ResourceStore) -> None:
    await store.create(TASK_KIND, task("t1"))
    with pytest.raises(AlreadyExists) as exists:
        await store.create(TASK_KIND, task("t1"))
    assert exists.value.code == 409
    with pytest.raises(NotFound) as missing:
        await store.get(TASK_KIND, "nope")
    assert missing.value.to_status()["message"] == 'tasks.loopd.dev "nope" not found'
    assert missing.value.to_status()["details"] == {"name": "nope", "group": "loopd.dev", "kind": "tasks"}


async def test_resource_version_is_global_and_strictly_increasing(store: ResourceStore) -> None:
    versions = []
    for index in range(3):
        versions.append(rv(await store.create(TASK_KIND, task(f"t{index}"))))
        versions.append(rv(await store.create(LEASE_KIND, lease(f"l{index}"))))
    versions.append(rv(await store.patch(TASK_KIND, "t0", {"spec": {"revision": 2}})))
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert int(await store.current_resource_version()) == versions[-1]


async def test_concurrent_writes_get_distinct_versions(store: ResourceStore) -> None:
    created = await asyncio.gather(*(store.create(TASK_KIND, task(f"c{i}")) for i in range(20)))
    versions = sorted(rv(obj) for obj in created)
    assert len(set(versions)) == 20
    await asyncio.gather(*(store.patch(TASK_KIND, "c0", {"metadata": {"labels": {f"k{i}": "v"}}}) for i in range(10)))
    labels = (await store.get(TASK_KIND, "c0"))["metadata"]["labels"]
    assert len(labels) == 10  # every read-modify-write landed: patches are serialized, none lost


async def test_stale_resource_version_is_conflict(store: ResourceStore) -> None:
    first = await store.create(TASK_KIND, task("t1"))
    first["spec"]["revision"] = 2
    updated = await store.update(TASK_KIND, first)
    assert updated["spec"]["revision"] == 2
    first["spec"]["revision"] = 3  # still carries the old resourceVersion
    with pytest.raises(Conflict) as conflict:
        await store.update(TASK_KIND, first)
    assert conflict.value.code == 409 and conflict.value.retryable
    with pytest.raises(Conflict):
        await store.patch(
            TASK_KIND, "t1", {"metadata": {"resourceVersion": first["metadata"]["resourceVersion"]}, "spec": {}}
        )
    unconditional = dict(updated)
    unconditional["metadata"] = {k: v for k, v in updated["metadata"].items() if k != "resourceVersion"}
    unconditional["spec"] = {**updated["spec"], "revision": 5}
    assert (await store.update(TASK_KIND, unconditional))["spec"]["revision"] == 5


async def test_generation_bumps_on_spec_changes_only(store: ResourceStore) -> None:
    created = await store.create(TASK_KIND, task("t1"))
    relabeled = await store.patch(TASK_KIND, "t1", {"metadata": {"labels": {"a": "b"}}})
    assert relabeled["metadata"]["generation"] == 1
    assert rv(relabeled) > rv(created)
    with_status = await store.patch(TASK_KIND, "t1", {"status": {"phase": "Running"}}, subresource="status")
    assert with_status["metadata"]["generation"] == 1
    bumped = await store.patch(TASK_KIND, "t1", {"spec": {"revision": 2}})
    assert bumped["metadata"]["generation"] == 2


async def test_noop_update_writes_nothing(store: ResourceStore) -> None:
    created = await store.create(TASK_KIND, task("t1"))
    again = await store.update(TASK_KIND, created)
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    patched = await store.patch(TASK_KIND, "t1", {"spec": {"revision": 1}})
    assert patched["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


async def test_status_subresource_separates_spec_and_status(store: ResourceStore) -> None:
    created = await store.create(TASK_KIND, {**task("t1"), "status": {"phase": "Ignored"}})
    assert "status" not in created  # create cannot set status
    with_status = await store.update_status(TASK_KIND, {**created, "status": {"phase": "Running"}})
    assert with_status["status"] == {"phase": "Running"}
    # The main resource ignores status; the status subresource ignores everything else.
    main = await store.update(
        TASK_KIND, {**with_status, "status": {"phase": "Hacked"}, "spec": {**with_status["spec"]}}
    )
    assert main["status"] == {"phase": "Running"}
    sneaky = {**main, "spec": {"target": {"kind": "harness", "key": "x"}}, "status": {"phase": "Done"}}
    status_only = await store.update_status(TASK_KIND, sneaky)
    assert status_only["status"] == {"phase": "Done"}
    assert status_only["spec"]["target"] == {"kind": "operator", "key": "router"}
    with pytest.raises(NotFound):
        await store.update_status(LEASE_KIND, lease("l1"))  # Lease has no status subresource


async def test_invalid_objects_name_the_field(store: ResourceStore) -> None:
    missing_key = task("t1")
    del missing_key["spec"]["target"]["key"]
    with pytest.raises(Invalid) as invalid:
        await store.create(TASK_KIND, missing_key)
    status = invalid.value.to_status()
    assert status["code"] == 422 and status["reason"] == "Invalid"
    assert status["details"]["kind"] == "Task" and status["details"]["name"] == "t1"
    assert status["details"]["causes"] == [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.target.key"}
    ]
    with pytest.raises(Invalid) as bad_enum:
        await store.create(TASK_KIND, task("t2", kind="robot"))
    assert [(c.reason, c.field) for c in bad_enum.value.causes] == [("FieldValueNotSupported", "spec.target.kind")]
    with pytest.raises(Invalid) as too_small:
        await store.create(TASK_KIND, task("t3", revision=0))
    assert [c.field for c in too_small.value.causes] == ["spec.revision"]
    with pytest.raises(Invalid) as bad_name:
        await store.create(TASK_KIND, task("Not_A_Name"))
    assert [c.field for c in bad_name.value.causes] == ["metadata.name"]
    with pytest.raises(Invalid) as wrong_type:
        await store.create(TASK_KIND, {**task("t4"), "spec": {"target": "router"}})
    assert [(c.reason, c.field) for c in wrong_type.value.causes] == [("FieldValueTypeInvalid", "spec.target")]
    created = await store.create(TASK_KIND, task("t5"))
    with pytest.raises(Invalid):
        await store.patch(TASK_KIND, "t5", {"spec": {"target": {"key": ""}}})
    assert await store.get(TASK_KIND, "t5") == created


async def test_unknown_fields_are_pruned_or_rejected_when_strict(store: ResourceStore) -> None:
    body = task("t1")
    body["spec"]["extra"] = 1
    body["junk"] = True
    created = await store.create(TASK_KIND, body)
    assert "extra" not in created["spec"] and "junk" not in created
    body["metadata"]["name"] = "t2"
    with pytest.raises(BadRequest) as strict:
        await store.create(TASK_KIND, body, field_validation="Strict")
    assert 'unknown field "spec.extra"' in strict.value.message


async def test_bad_requests(store: ResourceStore) -> None:
    with pytest.raises(Invalid, match='kind: Invalid value: "Lease": must be Task'):  # kube-apiserver's 422
        await store.create(TASK_KIND, {**task("t1"), "kind": "Lease"})
    with pytest.raises(BadRequest):
        await store.create(TASK_KIND, task("t1", namespace="a"), namespace="b")
    created = await store.create(TASK_KIND, task("t1"))
    with pytest.raises(BadRequest):
        await store.create(TASK_KIND, {**task("t2"), "metadata": dict(created["metadata"], name="t2")})
    with pytest.raises(BadRequest):
        await store.list(TASK_KIND, label_selector="a in (")


async def test_merge_and_json_patch(store: ResourceStore) -> None:
    await store.create(TASK_KIND, task("t1", labels={"a": "1", "b": "2"}))
    merged = await store.patch(TASK_KIND, "t1", {"metadata": {"labels": {"a": None, "c": "3"}}})
    assert merged["metadata"]["labels"] == {"b": "2", "c": "3"}
    patched = await store.patch(
        TASK_KIND,
        "t1",
        [
            {"op": "replace", "path": "/spec/revision", "value": 4},
            {"op": "add", "path": "/metadata/labels/d", "value": "4"},
        ],
        patch_type="json",
    )
    assert patched["spec"]["revision"] == 4 and patched["metadata"]["labels"]["d"] == "4"
    with pytest.raises(Invalid):
        await store.patch(TASK_KIND, "t1", [{"op": "test", "path": "/spec/revision", "value": 9}], patch_type="json")
    with pytest.raises(BadRequest):
        await store.patch(TASK_KIND, "t1", {"not": "a list"}, patch_type="json")
    with pytest.raises(NotFound):
        await store.patch(TASK_KIND, "nope", {"spec": {}})


async def test_apply_patch_creates_when_missing(store: ResourceStore) -> None:
    created = await store.patch(TASK_KIND, "t1", task("t1"), patch_type="apply")
    assert created["metadata"]["generation"] == 1
    applied = await store.patch(TASK_KIND, "t1", task("t1", revision=2), patch_type="apply")
    assert applied["spec"]["revision"] == 2


async def test_label_and_field_selectors(store: ResourceStore) -> None:
    await store.create(TASK_KIND, task("a", labels={"env": "prod", "tier": "web"}))
    await store.create(TASK_KIND, task("b", labels={"env": "dev"}))
    await store.create(TASK_KIND, task("c"))

    async def names(selector: str) -> list[str]:
        return [o["metadata"]["name"] for o in (await store.list(TASK_KIND, label_selector=selector)).items]

    assert await names("env=prod") == ["a"]
    assert await names("env==dev") == ["b"]
    assert await names("env!=prod") == ["b", "c"]
    assert await names("env in (prod, dev)") == ["a", "b"]
    assert await names("env notin (prod)") == ["b", "c"]
    assert await names("tier") == ["a"]
    assert await names("!tier") == ["b", "c"]
    assert await names("env=prod,tier=web") == ["a"]
    by_name = await store.list(TASK_KIND, field_selector="metadata.name=b")
    assert [o["metadata"]["name"] for o in by_name.items] == ["b"]
    not_b = await store.list(TASK_KIND, field_selector="metadata.name!=b,metadata.namespace=default")
    assert [o["metadata"]["name"] for o in not_b.items] == ["a", "c"]


async def test_list_scopes_and_pages(store: ResourceStore) -> None:
    for name in ("a", "b", "c", "d", "e"):
        await store.create(TASK_KIND, task(name))
    await store.create(TASK_KIND, task("z", namespace="other"))
    assert len((await store.list(TASK_KIND, namespace="default")).items) == 5
    everywhere = await store.list(TASK_KIND)
    assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in everywhere.items][-1] == ("other", "z")
    assert int(everywhere.resource_version) == int(await store.current_resource_version())
    seen: list[str] = []
    token: str | None = None
    while True:
        page = await store.list(TASK_KIND, namespace="default", limit=2, continue_token=token)
        seen.extend(o["metadata"]["name"] for o in page.items)
        token = page.continue_token
        if token is None:
            break
    assert seen == ["a", "b", "c", "d", "e"]
    with pytest.raises(BadRequest):
        await store.list(TASK_KIND, continue_token="%%%")


async def test_namespaces_are_provisioned_and_cluster_scoped(store: ResourceStore) -> None:
    await store.create(TASK_KIND, task("t1", namespace="team-a"))
    namespaces = [o["metadata"]["name"] for o in (await store.list(NAMESPACE_KIND)).items]
    assert namespaces == ["default", "team-a"]
    ns = await store.get(NAMESPACE_KIND, "team-a")
    assert "namespace" not in ns["metadata"] and ns["status"] == {"phase": "Active"}
    with pytest.raises(NotFound):
        await store.get(TASK_KIND, "t1")  # default namespace
    await store.delete(NAMESPACE_KIND, "team-a")
    with pytest.raises(NotFound):
        await store.get(TASK_KIND, "t1", namespace="team-a")


async def test_dry_run_persists_nothing(store: ResourceStore) -> None:
    before = await store.current_resource_version()
    preview = await store.create(TASK_KIND, task("t1"), dry_run=True)
    assert preview["metadata"]["uid"]
    with pytest.raises(NotFound):
        await store.get(TASK_KIND, "t1")
    assert await store.current_resource_version() == before
    await store.create(TASK_KIND, task("t1"))
    await store.patch(TASK_KIND, "t1", {"spec": {"revision": 7}}, dry_run=True)
    await store.delete(TASK_KIND, "t1", dry_run=True)
    assert (await store.get(TASK_KIND, "t1"))["spec"]["revision"] == 1


async def test_generate_name(store: ResourceStore) -> None:
    body = task("")
    body["metadata"] = {"generateName": "task-"}
    created = await store.create(TASK_KIND, body)
    assert created["metadata"]["name"].startswith("task-") and len(created["metadata"]["name"]) == 10


async def test_returned_objects_are_private_copies(store: ResourceStore) -> None:
    created = await store.create(TASK_KIND, task("t1"))
    created["spec"]["target"]["key"] = "mutated"
    assert (await store.get(TASK_KIND, "t1"))["spec"]["target"]["key"] == "router"


async def test_delete_preconditions(store: ResourceStore) -> None:
    created = await store.create(TASK_KIND, task("t1"))
    with pytest.raises(Conflict):
        await store.delete(TASK_KIND, "t1", uid="someone-else")
    await store.patch(TASK_KIND, "t1", {"spec": {"revision": 2}})
    with pytest.raises(Conflict):
        await store.delete(TASK_KIND, "t1", resource_version=created["metadata"]["resourceVersion"])
    deleted = await store.delete(TASK_KIND, "t1", uid=created["metadata"]["uid"])
    assert rv(deleted) > rv(created)
    with pytest.raises(NotFound):
        await store.delete(TASK_KIND, "t1")


async def test_a_closed_store_refuses_work_with_a_typed_error(open_store: Any) -> None:
    store: ResourceStore = await open_store()
    await store.aclose()
    with pytest.raises(StoreUnavailable) as closed:
        await store.get(TASK_KIND, "t1")
    assert closed.value.retryable and closed.value.code == 503


def _record_writes(store: ResourceStore) -> list[str]:
    """The SQL of every statement the store's write transactions run from now on."""
    statements: list[str] = []
    backend = store._backend  # type: ignore[attr-defined]
    write = backend.write

    @contextlib.asynccontextmanager
    async def recorded() -> AsyncIterator[Any]:
        async with write() as conn:
            fetch, execute = conn.fetch, conn.execute

            async def rows(sql: str, params: Any = ()) -> Any:
                statements.append(sql)
                return await fetch(sql, params)

            async def run(sql: str, params: Any = ()) -> Any:
                statements.append(sql)
                return await execute(sql, params)

            conn.fetch, conn.execute = rows, run
            try:
                yield conn
            finally:
                conn.fetch, conn.execute = fetch, execute

    backend.write = recorded
    return statements


async def test_a_write_takes_its_versions_from_the_counter_it_advances_in_one_statement(store: ResourceStore) -> None:
    """One change: the version counter is advanced and read in one statement, not read first and written after;
    two changes in one transaction (an object and the namespace it needs): consecutive versions, the counter set
    once to the last; a write that changes nothing leaves the counter alone."""
    first = rv(await store.create(TASK_KIND, task("t1")))
    statements = _record_writes(store)
    second = rv(await store.create(TASK_KIND, task("t2")))
    counters = [s for s in statements if "resource_counters" in s]
    assert second == first + 1
    assert len(counters) == 1 and counters[0].startswith("UPDATE") and "RETURNING" in counters[0]
    statements.clear()
    in_new_namespace = await store.create(TASK_KIND, task("t3", namespace="elsewhere"))
    namespace = await store.get(NAMESPACE_KIND, "elsewhere")
    assert (rv(namespace), rv(in_new_namespace)) == (second + 1, second + 2)
    assert len([s for s in statements if "resource_counters" in s]) == 2  # taken, then set to the last
    assert int(await store.current_resource_version()) == second + 2
    statements.clear()
    unchanged = await store.patch(TASK_KIND, "t1", {"spec": {"revision": 1}})
    assert rv(unchanged) == first
    assert not [s for s in statements if "resource_counters" in s]
    assert rv(await store.create(TASK_KIND, task("t4"))) == second + 3
