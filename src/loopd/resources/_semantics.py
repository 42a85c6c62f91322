"""Kubernetes object semantics over any ``Backend``: the one implementation of ``ResourceStore``.

Owns: create / get / list / update / update_status / patch / delete / watch rules — resourceVersion allocation,
optimistic concurrency, generation bumps, the status subresource, finalizers and deletionTimestamp, owner-reference
cascade, namespace auto-provisioning, CRD registration and the seeding of built-in CRDs.
Must not do: SQL dialect or driver details (``_sql`` and the backends), HTTP (``_api``).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Self, TypeVar

from loopd._infra.errors import LoopdError
from loopd._infra.jsoncopy import json_copy

from . import _sql as sql
from ._builtin_kinds import CRD_KIND, NAMESPACE_KIND, builtin_crds, builtin_kind_specs
from ._composing import (
    CRD_STORAGE,
    NAMESPACE_STORAGE,
    apply_kind_rules,
    check_preconditions,
    compose_status,
    compose_update,
    decode_continue,
    encode_continue,
    metadata_of,
    normalize_input,
    not_found,
    object_key,
    owner_uids,
    prepare_create,
    resolve_namespace,
    rv_of,
)
from ._crds import kind_specs_from_crd
from ._errors import (
    AlreadyExists,
    BadRequest,
    Cause,
    Conflict,
    ErrorDetails,
    Forbidden,
    Invalid,
    NotFound,
)
from ._kinds import KindRef, KindRegistry, KindSpec
from ._patching import PatchType, apply_patch
from ._selectors import FieldSelector, LabelSelector
from ._sql import Backend, Change, ObjectKey
from ._store import FieldValidation, ObjectList, PropagationPolicy, ResourceStore, StoreOptions
from ._validation import UnknownFields, invalid_error
from ._watching import Watch, WatchHub, WatchTarget, present

_log = logging.getLogger(__name__)

_T = TypeVar("_T")


class _Rollback(LoopdError):
    def __init__(self, result: object) -> None:
        super().__init__("dry run")
        self.result = result


@dataclass
class _WriteTx:
    conn: sql.Connection
    rv: int = 0
    """The last resource version this transaction took (0: none yet)."""
    start_rv: int = 0
    """The version before this transaction's first change (known once it took one)."""
    taken: int = 0
    changes: list[Change] = field(default_factory=list)

    async def next_rv(self) -> int:
        """The next resource version: the first advances the stored counter in the same statement that reads it
        (the write lock is held, so nobody takes one in between); later ones count on from it, and the counter is
        set to the last at the end (`SemanticStore._transact`). A transaction that changes nothing touches no
        counter."""
        if self.taken:
            self.rv += 1
        else:
            self.rv = await sql.take_counter(self.conn, "rv")
            self.start_rv = self.rv - 1
        self.taken += 1
        return self.rv

    async def record(self, key: ObjectKey, kind: str, body: dict[str, Any], prev: dict[str, Any] | None) -> None:
        change = Change(rv=self.rv, key=key, type=kind, body=body, prev=prev)
        await sql.append_event(self.conn, change)
        self.changes.append(change)


class SemanticStore:
    """``ResourceStore`` over a ``Backend``. Construct through a backend's ``open()``."""

    pumps_in_background = True
    """Whether a task dispatches committed changes to watches (the in-memory store dispatches in ``_committed``)."""

    def __init__(self, backend: Backend, options: StoreOptions) -> None:
        self._backend = backend
        self._options = options
        self._registry = KindRegistry(builtin_kind_specs())
        self._hub = WatchHub(
            read_changes=self._read_changes,
            read_snapshot=self._read_snapshot,
            compact=self._compact,
            on_change=self._apply_registry_change,
            options=options,
        )
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------------------------

    @classmethod
    async def _open_on(cls, backend: Backend, options: StoreOptions) -> Self:
        """A started store over ``backend`` (what a backend's ``open()`` returns); closed again if starting fails."""
        store = cls(backend, options)
        try:
            await store._start()
        except BaseException:
            await store.aclose()
            raise
        return store

    async def _start(self) -> None:
        async with self._backend.read() as conn:
            crds = await sql.list_objects(conn, *CRD_STORAGE, None)
            rv = await sql.read_counter(conn, "rv")
            compacted = await sql.read_counter(conn, "compacted_rv")
        for crd in crds:
            self._register_crd(crd)
        self._hub.start(rv, compacted, pump=self.pumps_in_background)
        self._backend.listen(self._hub.wake)
        await self._seed()

    async def _seed(self) -> None:
        for crd in builtin_crds():
            name = crd["metadata"]["name"]
            try:
                existing = await self.get(CRD_KIND, name)
            except NotFound:
                with contextlib.suppress(AlreadyExists):  # another replica seeded it concurrently
                    await self.create(CRD_KIND, crd)
                continue
            if existing.get("spec") != crd["spec"]:
                existing["spec"] = crd["spec"]
                with contextlib.suppress(Conflict):  # another replica updated it concurrently
                    await self.update(CRD_KIND, existing)
        with contextlib.suppress(AlreadyExists):
            await self.create(NAMESPACE_KIND, {"metadata": {"name": "default"}})

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._hub.aclose()
        await self._backend.aclose()

    @property
    def registry(self) -> KindRegistry:
        return self._registry

    @property
    def options(self) -> StoreOptions:
        return self._options

    # -- reads -------------------------------------------------------------------------------------------------

    async def get(self, ref: KindRef, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        spec = self._registry.get(ref)
        key = object_key(spec, resolve_namespace(spec, None, namespace), name)
        async with self._backend.read() as conn:
            body = await sql.get_object(conn, key)
        if body is None:
            raise not_found(spec, name)
        return present(spec, body)

    async def list(
        self,
        ref: KindRef,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> ObjectList:
        spec = self._registry.get(ref)
        labels = LabelSelector.parse(label_selector)
        fields = selectable_fields(spec, field_selector)
        scope = (namespace or None) if spec.namespaced else None
        after = decode_continue(continue_token) if continue_token else None
        if limit is not None and limit < 0:
            raise BadRequest("limit must not be negative")
        async with self._backend.read() as conn:
            rv = await sql.read_counter(conn, "rv")
            bodies = await sql.list_objects(conn, *spec.storage_key, scope, after)
        items: list[dict[str, Any]] = []
        next_token: str | None = None
        remaining: int | None = None
        for index, body in enumerate(bodies):
            if not (labels.matches(metadata_of(body).get("labels")) and fields.matches(body)):
                continue
            if limit and len(items) >= limit:
                last = metadata_of(items[-1])
                next_token = encode_continue(str(last.get("namespace", "")), str(last.get("name", "")))
                if labels.empty and fields.empty:  # as kube-apiserver: counted only for an unfiltered list
                    remaining = len(bodies) - index
                break
            items.append(present(spec, body))
        return ObjectList(
            items=items, resource_version=str(rv), continue_token=next_token, remaining_item_count=remaining
        )

    async def current_resource_version(self) -> str:
        async with self._backend.read() as conn:
            return str(await sql.read_counter(conn, "rv"))

    def watch(
        self,
        ref: KindRef,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        bookmarks: bool = False,
    ) -> Watch:
        spec = self._registry.get(ref)
        if resource_version not in (None, "") and not (resource_version.isascii() and resource_version.isdigit()):
            raise BadRequest(f"resourceVersion: Invalid value: {json.dumps(resource_version)}: must be an integer")
        target = WatchTarget(
            spec=spec,
            namespace=(namespace or None) if spec.namespaced else None,
            labels=LabelSelector.parse(label_selector),
            fields=selectable_fields(spec, field_selector),
        )
        return Watch(self._hub, target, resource_version, bookmarks)

    # -- writes ------------------------------------------------------------------------------------------------

    async def create(
        self,
        ref: KindRef,
        obj: Mapping[str, Any],
        *,
        namespace: str | None = None,
        dry_run: bool = False,
        field_validation: FieldValidation = "Ignore",
    ) -> dict[str, Any]:
        spec = self._registry.get(ref)
        key, body = prepare_create(spec, obj, namespace, strict=field_validation == "Strict", now=self._now())

        async def op(tx: _WriteTx) -> dict[str, Any]:
            return await self._create_in_tx(tx, spec, key, body)

        return present(spec, await self._transact(op, dry_run))

    async def update(
        self,
        ref: KindRef,
        obj: Mapping[str, Any],
        *,
        namespace: str | None = None,
        dry_run: bool = False,
        field_validation: FieldValidation = "Ignore",
    ) -> dict[str, Any]:
        return await self._update(ref, obj, namespace, dry_run, status=False, strict=field_validation == "Strict")

    async def update_status(
        self, ref: KindRef, obj: Mapping[str, Any], *, namespace: str | None = None, dry_run: bool = False
    ) -> dict[str, Any]:
        return await self._update(ref, obj, namespace, dry_run, status=True, strict=False)

    async def _update(
        self, ref: KindRef, obj: Mapping[str, Any], namespace: str | None, dry_run: bool, *, status: bool, strict: bool
    ) -> dict[str, Any]:
        spec = self._registry.get(ref)
        body = normalize_input(spec, obj)
        meta = metadata_of(body)
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_error(
                spec, "", [Cause("FieldValueRequired", "Required value: name is required", "metadata.name")]
            )
        key = object_key(spec, resolve_namespace(spec, meta.get("namespace"), namespace), name)
        if status and not spec.status_subresource:
            raise NotFound(f"{spec.qualified_resource} has no status subresource", details=spec.details(name))

        async def op(tx: _WriteTx) -> dict[str, Any]:
            existing = await sql.get_object(tx.conn, key)
            if existing is None:
                raise not_found(spec, name)
            check_preconditions(spec, existing, meta.get("resourceVersion"), meta.get("uid"))
            new = (
                compose_status(spec, existing, body)
                if status
                else compose_update(spec, existing, body, strict=strict, now=self._now())
            )
            return await self._replace(tx, spec, key, existing, new)

        return present(spec, await self._transact(op, dry_run))

    async def patch(
        self,
        ref: KindRef,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
        subresource: Literal["status"] | None = None,
        dry_run: bool = False,
        field_validation: FieldValidation = "Ignore",
    ) -> dict[str, Any]:
        spec = self._registry.get(ref)
        if subresource not in (None, "status"):
            raise NotFound(f"unknown subresource {subresource!r}")
        if subresource == "status" and not spec.status_subresource:
            raise NotFound(f"{spec.qualified_resource} has no status subresource", details=spec.details(name))
        strict = field_validation == "Strict"
        key = object_key(spec, resolve_namespace(spec, None, namespace), name)

        async def op(tx: _WriteTx) -> dict[str, Any]:
            existing = await sql.get_object(tx.conn, key)
            if existing is None:
                if patch_type != "apply" or subresource is not None:
                    raise not_found(spec, name)
                applied = apply_patch({}, patch, patch_type)
                applied.setdefault("metadata", {})
                if isinstance(applied["metadata"], dict):
                    applied["metadata"].setdefault("name", name)
                new_key, body = prepare_create(spec, applied, namespace or None, strict=strict, now=self._now())
                if new_key != key:
                    raise BadRequest("the name or namespace of the object does not match the request")
                return await self._create_in_tx(tx, spec, key, body)
            patched = apply_patch(present(spec, existing), patch, patch_type)
            meta = metadata_of(patched)
            if meta.get("name") != name:
                raise BadRequest(
                    f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
                )
            check_preconditions(spec, existing, meta.get("resourceVersion"), meta.get("uid"))
            if subresource == "status":
                new = compose_status(spec, existing, patched)
            else:
                try:
                    new = compose_update(spec, existing, patched, strict=strict, now=self._now())
                except UnknownFields as exc:  # kube-apiserver: a strict patch error is 422 on the field "patch"
                    rendered = json.dumps(json.dumps(patched, separators=(",", ":")))
                    cause = Cause("FieldValueInvalid", f"Invalid value: {rendered}: {exc.decoding_error}", "patch")
                    raise Invalid(f' "" is invalid: patch: {cause.message}', causes=(cause,)) from exc
            return await self._replace(tx, spec, key, existing, new)

        return present(spec, await self._transact(op, dry_run))

    async def delete(
        self,
        ref: KindRef,
        name: str,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
        uid: str | None = None,
        propagation_policy: PropagationPolicy = "Background",
        dry_run: bool = False,
    ) -> dict[str, Any]:
        spec = self._registry.get(ref)
        if propagation_policy not in ("Background", "Foreground", "Orphan"):
            raise BadRequest(f"unsupported propagationPolicy {propagation_policy!r}")
        key = object_key(spec, resolve_namespace(spec, None, namespace), name)

        async def op(tx: _WriteTx) -> dict[str, Any]:
            existing = await sql.get_object(tx.conn, key)
            if existing is None:
                raise not_found(spec, name)
            existing_uid = str(metadata_of(existing).get("uid", ""))
            if uid and uid != existing_uid:
                raise _precondition_failed(
                    spec,
                    name,
                    f"the UID in the precondition ({uid}) does not match the UID in record "
                    f"({existing_uid}). The object might have been deleted and then recreated",
                )
            if resource_version and resource_version != rv_of(existing):
                raise _precondition_failed(
                    spec,
                    name,
                    f"the ResourceVersion in the precondition ({resource_version}) does not match the "
                    f"ResourceVersion in record ({rv_of(existing)}). The object might have been modified",
                )
            if spec.storage_key == CRD_STORAGE and self._crd_is_builtin(existing):
                raise Forbidden(f'the built-in CustomResourceDefinition "{name}" cannot be deleted')
            return await self._delete_in_tx(tx, spec, key, existing, propagation_policy)

        return present(spec, await self._transact(op, dry_run))

    # -- transaction plumbing ----------------------------------------------------------------------------------

    async def _transact(self, op: Callable[[_WriteTx], Awaitable[_T]], dry_run: bool) -> _T:
        tx: _WriteTx | None = None
        try:
            async with self._backend.write() as conn:
                tx = _WriteTx(conn=conn)
                result = await op(tx)
                if dry_run:
                    raise _Rollback(result)
                if tx.taken:
                    if tx.taken > 1:
                        await sql.write_counter(conn, "rv", tx.rv)
                    await self._backend.announce(conn)
        except _Rollback as rollback:
            return rollback.result  # type: ignore[return-value]
        for change in tx.changes:
            self._apply_registry_change(change)
        if tx.changes:
            await self._committed(tx.start_rv, tx.changes)
        return result

    async def _committed(self, start_rv: int, changes: builtins.list[Change]) -> None:
        """Changes were committed: the watches get them at once when they follow what the watches have (no read of
        the log); otherwise the pump is woken to read it (the in-memory store always pumps at once)."""
        if not await self._hub.dispatch_committed(start_rv, changes):
            self._hub.notify()

    async def _read_changes(self, after: int, limit: int) -> tuple[builtins.list[Change], int]:
        async with self._backend.read() as conn:
            compacted = await sql.read_counter(conn, "compacted_rv")
            changes = await sql.events_after(conn, after, limit)
        return changes, compacted

    async def _read_snapshot(self, spec: KindSpec, namespace: str | None) -> tuple[builtins.list[dict[str, Any]], int]:
        async with self._backend.read() as conn:
            rv = await sql.read_counter(conn, "rv")
            bodies = await sql.list_objects(conn, *spec.storage_key, namespace)
        return bodies, rv

    async def _compact(self, through_rv: int) -> None:
        async with self._backend.write() as conn:
            await sql.compact_events(conn, through_rv)

    # -- writes inside a transaction ---------------------------------------------------------------------------

    async def _create_in_tx(self, tx: _WriteTx, spec: KindSpec, key: ObjectKey, body: dict[str, Any]) -> dict[str, Any]:
        name = key[3]
        if await sql.get_object(tx.conn, key) is not None:
            raise AlreadyExists(f'{spec.qualified_resource} "{name}" already exists', details=spec.details(name))
        if spec.namespaced:
            await self._ensure_namespace(tx, key[2])
        stored = json_copy(body)
        meta = stored["metadata"]
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = self._now()
        meta["generation"] = 1
        meta["resourceVersion"] = str(await tx.next_rv())
        await sql.put_object(tx.conn, key, stored, tx.rv, owner_uids(stored), previous_owners=[])
        await tx.record(key, "ADDED", stored, None)
        return stored

    async def _ensure_namespace(self, tx: _WriteTx, namespace: str) -> None:
        key: ObjectKey = ("", "namespaces", "", namespace)
        if await sql.get_object(tx.conn, key) is not None:
            return
        spec = self._registry.get(NAMESPACE_KIND)
        _, body = prepare_create(spec, {"metadata": {"name": namespace}}, None, strict=False, now=self._now())
        await self._create_in_tx(tx, spec, key, body)

    async def _replace(
        self, tx: _WriteTx, spec: KindSpec, key: ObjectKey, existing: dict[str, Any], new: dict[str, Any]
    ) -> dict[str, Any]:
        new["metadata"]["resourceVersion"] = rv_of(existing)
        if new == existing:
            return existing
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            # As kube-apiserver: the DELETED event carries the last stored state (the finalizers still on it).
            removed = await self._remove(tx, spec, key, existing, "Background")
            new["metadata"]["resourceVersion"] = removed["metadata"]["resourceVersion"]
            return new
        meta["resourceVersion"] = str(await tx.next_rv())
        await sql.put_object(tx.conn, key, new, tx.rv, owner_uids(new), previous_owners=owner_uids(existing))
        await tx.record(key, "MODIFIED", new, existing)
        return new

    async def _delete_in_tx(
        self, tx: _WriteTx, spec: KindSpec, key: ObjectKey, obj: dict[str, Any], policy: PropagationPolicy
    ) -> dict[str, Any]:
        meta = metadata_of(obj)
        if meta.get("finalizers"):
            if policy == "Orphan":
                await self._orphan_dependents(tx, str(meta.get("uid", "")))
            if meta.get("deletionTimestamp"):
                return obj
            new = json_copy(obj)
            _mark_deleting(new, self._now())
            if spec.storage_key == NAMESPACE_STORAGE:
                new = apply_kind_rules(spec, new, self._now())
            return await self._replace(tx, spec, key, obj, new)
        if policy != "Background" and spec.storage_key not in (NAMESPACE_STORAGE, CRD_STORAGE):
            return await self._delete_parked(tx, spec, key, obj, policy)
        return await self._remove(tx, spec, key, obj, policy)

    async def _delete_parked(
        self, tx: _WriteTx, spec: KindSpec, key: ObjectKey, obj: dict[str, Any], policy: PropagationPolicy
    ) -> dict[str, Any]:
        """Foreground / Orphan as kube-apiserver and its garbage collector do them, in one write: the owner parked
        behind the ``foregroundDeletion`` / ``orphan`` finalizer (a MODIFIED event; what the caller gets back), its
        dependents deleted or orphaned, then the finalizer released, which removes the owner (DELETED)."""
        parked = json_copy(obj)
        _mark_deleting(parked, self._now())
        meta = parked["metadata"]
        meta["finalizers"] = ["foregroundDeletion" if policy == "Foreground" else "orphan"]
        parked = await self._replace(tx, spec, key, obj, parked)
        uid = str(meta.get("uid", ""))
        if policy == "Foreground":
            await self._collect_dependents(tx, uid)
        else:
            await self._orphan_dependents(tx, uid)
        await self._remove(tx, spec, key, parked, "Background")  # the finalizer released; DELETED shows it parked
        return parked

    async def _remove(
        self, tx: _WriteTx, spec: KindSpec, key: ObjectKey, obj: dict[str, Any], policy: PropagationPolicy
    ) -> dict[str, Any]:
        final = json_copy(obj)
        final["metadata"]["resourceVersion"] = str(await tx.next_rv())
        await sql.delete_object(tx.conn, key)
        await tx.record(key, "DELETED", final, None)
        uid = str(final["metadata"].get("uid", ""))
        if policy == "Orphan":
            await self._orphan_dependents(tx, uid)
        else:
            await self._collect_dependents(tx, uid)
        if spec.storage_key == NAMESPACE_STORAGE:
            for dependent_key in await sql.keys_in_namespace(tx.conn, key[3]):
                await self._delete_key(tx, dependent_key)
        elif spec.storage_key == CRD_STORAGE and not self._crd_is_builtin(final):
            crd_spec = final.get("spec") or {}
            group, plural = str(crd_spec.get("group", "")), str((crd_spec.get("names") or {}).get("plural", ""))
            for instance in await sql.list_objects(tx.conn, group, plural, None):
                instance_meta = metadata_of(instance)
                instance_key = (group, plural, str(instance_meta.get("namespace", "")), str(instance_meta["name"]))
                instance_spec = self._storage_spec(group, plural) or spec
                await self._remove(tx, instance_spec, instance_key, instance, "Background")
        return final

    async def _delete_key(self, tx: _WriteTx, key: ObjectKey) -> None:
        obj = await sql.get_object(tx.conn, key)
        if obj is None:
            return
        spec = self._storage_spec(key[0], key[1])
        if spec is None:
            await sql.delete_object(tx.conn, key)
            return
        await self._delete_in_tx(tx, spec, key, obj, "Background")

    async def _collect_dependents(self, tx: _WriteTx, owner_uid: str) -> None:
        for key in await sql.dependents_of(tx.conn, owner_uid):
            dependent = await sql.get_object(tx.conn, key)
            if dependent is None:
                continue
            spec = self._storage_spec(key[0], key[1])
            refs = metadata_of(dependent).get("ownerReferences") or []
            others = [ref for ref in refs if isinstance(ref, dict) and ref.get("uid") != owner_uid]
            if spec is None:
                await sql.delete_object(tx.conn, key)
            elif others and await self._any_owner_alive(tx, key, others):
                new = json_copy(dependent)
                new["metadata"]["ownerReferences"] = others
                await self._replace(tx, spec, key, dependent, new)
            else:
                await self._delete_in_tx(tx, spec, key, dependent, "Background")

    async def _orphan_dependents(self, tx: _WriteTx, owner_uid: str) -> None:
        for key in await sql.dependents_of(tx.conn, owner_uid):
            dependent = await sql.get_object(tx.conn, key)
            spec = self._storage_spec(key[0], key[1])
            if dependent is None or spec is None:
                continue
            new = json_copy(dependent)
            refs = [r for r in new["metadata"].get("ownerReferences") or [] if r.get("uid") != owner_uid]
            if refs:
                new["metadata"]["ownerReferences"] = refs
            else:
                new["metadata"].pop("ownerReferences", None)
            await self._replace(tx, spec, key, dependent, new)

    async def _any_owner_alive(self, tx: _WriteTx, key: ObjectKey, refs: builtins.list[dict[str, Any]]) -> bool:
        for ref in refs:
            try:
                owner_spec = self._registry.get(KindRef(str(ref.get("apiVersion", "")), str(ref.get("kind", ""))))
            except NotFound:
                continue
            owner_key = object_key(owner_spec, key[2] if owner_spec.namespaced else "", str(ref.get("name", "")))
            owner = await sql.get_object(tx.conn, owner_key)
            if owner is not None and metadata_of(owner).get("uid") == ref.get("uid"):
                return True
        return False

    # -- registry ----------------------------------------------------------------------------------------------

    def _apply_registry_change(self, change: Change) -> None:
        if change.key[:2] != CRD_STORAGE:
            return
        if change.type == "DELETED":
            self._registry.unregister(change.key[3])
        else:
            self._register_crd(change.body)

    def _register_crd(self, crd: dict[str, Any]) -> None:
        name = str(metadata_of(crd).get("name", ""))
        try:
            self._registry.register(name, kind_specs_from_crd(crd))
        except Invalid as exc:
            _log.warning("ignoring invalid stored CustomResourceDefinition %s: %s", name, exc.message)

    def _crd_is_builtin(self, crd: Mapping[str, Any]) -> bool:
        crd_spec = crd.get("spec") or {}
        return self._registry.is_builtin(
            str(crd_spec.get("group", "")), str((crd_spec.get("names") or {}).get("plural", ""))
        )

    def _storage_spec(self, group: str, plural: str) -> KindSpec | None:
        specs = self._registry.storage_specs(group, plural)
        return specs[0] if specs else None

    # -- small helpers -----------------------------------------------------------------------------------------

    def _now(self) -> str:
        return self._options.clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")


def _mark_deleting(obj: dict[str, Any], now: str) -> None:
    """Set ``deletionTimestamp`` the first time, bumping ``generation`` once as kube-apiserver does."""
    meta = obj["metadata"]
    meta["deletionTimestamp"] = now
    meta["deletionGracePeriodSeconds"] = 0
    meta["generation"] = int(meta.get("generation", 1)) + 1


def _precondition_failed(spec: KindSpec, name: str, why: str) -> Conflict:
    """kube-apiserver's 409 for a failed delete precondition (it names the Kind, not the resource)."""
    kind = f"{spec.kind}.{spec.group}" if spec.group else spec.kind
    return Conflict(
        f'Operation cannot be fulfilled on {kind} "{name}": {why}',
        details=ErrorDetails(name=name, group=spec.group, kind=spec.kind),
    )


_SELECTABLE = ("metadata.name", "metadata.namespace")


def selectable_fields(spec: KindSpec, text: str | None) -> FieldSelector:
    """Parse a field selector, refusing fields kube-apiserver cannot select on for this kind (``BadRequest``)."""
    fields = FieldSelector.parse(text)
    for requirement in fields.requirements:
        label = ".".join(requirement.path)
        allowed = (*_SELECTABLE, "status.phase") if spec.storage_key == NAMESPACE_STORAGE else _SELECTABLE
        if label in allowed:
            continue
        if spec.group in ("", "coordination.k8s.io", "apiextensions.k8s.io"):
            raise BadRequest(f'"{label}" is not a known field selector: only "metadata.name", "metadata.namespace"')
        raise BadRequest(f"field label not supported: {label}")
    return fields


def _conforms(engine: SemanticStore) -> ResourceStore:
    """Static check (mypy): the engine implements the ``ResourceStore`` protocol."""
    return engine
