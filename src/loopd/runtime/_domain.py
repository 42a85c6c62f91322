"""Domain resources: an operator's own kinds (typed ``loopd.resources.KubeObject`` models) through the Kubernetes API.

Owns: ``rt.resources(Model)`` → ``ResourceVerbs`` (get, find, list, create with an owner, patch_status,
replace_status, delete), ``rt.watch(Model, reconciler, owns=...)`` (the ``DomainController`` that puts a typed
reconciler on the reconcile runtime, waking the owner when an owned object changes) and ``ensure_crds`` (create
or update CRDs, wait until Established). Errors are the runtime's tree (``error_from_resource``).
Must not do: talk to loop-server, read time except through the runtime's clock, or import loopd.server /
loopd.harness / loopd.cli.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from loopd._infra.clock import Clock
from loopd.resources import KubeObject, ResourceError
from loopd.resources.client import ResourceClient, ResourceType
from loopd.resources.reconcile import Informer, LeaderElection, Request, Result, TemporaryError

from ._errors import AlreadyExists, CapacityFull, Conflict, NotFound, RuntimeApiError, Unavailable, error_from_resource
from ._records import InvalidResponse
from ._tasks import Task

if TYPE_CHECKING:
    from ._runtime import Runtime

logger = logging.getLogger("loopd.runtime")

_DELETE_ATTEMPTS = 5

M = TypeVar("M", bound=KubeObject)
M_contra = TypeVar("M_contra", bound=KubeObject, contravariant=True)

CRDS = ResourceType(
    "apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", namespaced=False
)
"""CustomResourceDefinitions (cluster-scoped, with a status)."""

Owner = KubeObject | Task | Mapping[str, Any]
"""What may own an object: a typed object, a ``Task`` (the runtime's), or a Kubernetes object dict — anything
with apiVersion, kind, name and uid."""


def resource_type(model: type[KubeObject]) -> ResourceType:
    """The REST resource of a typed model (from its ``declaration``)."""
    d = model.declaration
    return ResourceType(
        d.group, d.version, d.kind, d.plural, namespaced=d.namespaced, status_subresource=d.status_subresource
    )


def owner_reference(owner: Owner, *, controller: bool = True) -> dict[str, Any]:
    """The ``ownerReferences`` entry naming ``owner`` (``controller: true`` by default: the one owner that
    ``rt.watch(..., owns=...)`` wakes). ``ValueError`` when the owner has no name or uid yet (not created)."""
    if isinstance(owner, Task):
        api_version, kind, name, uid = "loopd.dev/v1alpha1", "Task", owner.id, owner.uid
    elif isinstance(owner, KubeObject):
        api_version, kind = owner.api_version, owner.kind
        name, uid = owner.metadata.name or "", owner.metadata.uid or ""
    else:
        metadata = owner.get("metadata") or {}
        api_version, kind = str(owner.get("apiVersion") or ""), str(owner.get("kind") or "")
        name, uid = str(metadata.get("name") or ""), str(metadata.get("uid") or "")
    if not (api_version and kind and name and uid):
        raise ValueError(f"an owner needs apiVersion, kind, name and uid (got {kind or '?'} {name or '?'!r})")
    ref: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid}
    if controller:
        ref["controller"] = True
    return ref


def _owner_namespace(owner: Owner | None) -> str | None:
    if isinstance(owner, Task):
        return owner.namespace or None
    if isinstance(owner, KubeObject):
        return owner.metadata.namespace
    if isinstance(owner, Mapping):
        return (owner.get("metadata") or {}).get("namespace") or None
    return None


def _dump(value: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        dumped: dict[str, Any] = value.model_dump(mode="json", by_alias=True, exclude_none=True)
        return dumped
    return dict(value)


def _contains(wanted: Any, actual: Any) -> bool:
    """Whether ``actual`` holds everything ``wanted`` says (servers add defaults; they never drop what was set)."""
    if isinstance(wanted, Mapping):
        return isinstance(actual, Mapping) and all(k in actual and _contains(v, actual[k]) for k, v in wanted.items())
    if isinstance(wanted, list):
        return isinstance(actual, list) and len(wanted) == len(actual) and all(map(_contains, wanted, actual))
    return bool(wanted == actual)


class ResourceVerbs(Generic[M]):
    """``rt.resources(Model)``: typed reads and writes of one kind through the Kubernetes API.

    Objects go in and come out as the model (``Model.model_validate`` of the API's answer: defaults applied,
    ``metadata`` filled). Namespaced kinds default to the object's namespace, then the owner's, then the
    runtime's. Errors: ``NotFound``, ``AlreadyExists`` / ``Conflict`` (a stale ``resourceVersion``), ``Invalid``
    (schema, immutable spec), ``Forbidden``, ``Unavailable`` (no answer, 5xx; retryable)."""

    def __init__(self, runtime: Runtime, model: type[M]) -> None:
        self._runtime = runtime
        self.model = model
        self.type = resource_type(model)

    def _namespace(self, namespace: str | None) -> str | None:
        return (namespace or self._runtime.namespace) if self.type.namespaced else None

    def _parse(self, obj: Mapping[str, Any]) -> M:
        try:
            return self.model.model_validate(obj)
        except ValidationError as exc:
            name = (obj.get("metadata") or {}).get("name", "?")
            raise InvalidResponse(f"{self.type} {name!r} does not fit {self.model.__name__}: {exc}") from exc

    async def _call(self, operation: Callable[[ResourceClient], Awaitable[Any]]) -> Any:
        client = await self._runtime.resource_client()
        try:
            return await operation(client)
        except ResourceError as exc:
            raise error_from_resource(exc) from exc

    async def get(self, name: str, *, namespace: str | None = None) -> M:
        """The object named ``name`` (``NotFound`` when there is none)."""
        ns = self._namespace(namespace)
        return self._parse(await self._call(lambda c: c.get(self.type, name, namespace=ns)))

    async def find(self, name: str, *, namespace: str | None = None) -> M | None:
        """The object named ``name``, or None when there is none."""
        try:
            return await self.get(name, namespace=namespace)
        except NotFound:
            return None

    async def list(self, *, namespace: str | None = None, label_selector: str | None = None) -> list[M]:
        """Every object (in the namespace; all pages), optionally matching a label selector."""
        ns = self._namespace(namespace)
        found = await self._call(lambda c: c.list(self.type, namespace=ns, label_selector=label_selector))
        return [self._parse(item) for item in found.items]

    async def create(
        self, obj: M, *, owner: Owner | None = None, namespace: str | None = None, exist_ok: bool = False
    ) -> M:
        """Create ``obj``; with ``owner`` it is owned by it (``ownerReferences``, ``controller: true``), so it is
        garbage-collected with it and ``rt.watch(..., owns=...)`` wakes the owner when it changes.
        ``exist_ok=True`` makes a repeated create idempotent: an existing object of that name is returned when its
        spec holds what ``obj``'s says and it has the same owner; otherwise ``AlreadyExists``."""
        body = obj.to_object()
        metadata = body.setdefault("metadata", {})
        for key in ("resourceVersion", "uid", "creationTimestamp", "generation"):
            metadata.pop(key, None)
        if owner is not None:
            ref = owner_reference(owner)
            others = [r for r in metadata.get("ownerReferences") or () if r.get("uid") != ref["uid"]]
            metadata["ownerReferences"] = [*others, ref]
        ns = self._namespace(namespace or metadata.get("namespace") or _owner_namespace(owner))
        if ns is not None:
            metadata["namespace"] = ns
        try:
            return self._parse(await self._call(lambda c: c.create(self.type, body, namespace=ns)))
        except AlreadyExists:
            if not exist_ok:
                raise
        existing = await self._call(lambda c: c.get(self.type, str(metadata.get("name", "")), namespace=ns))
        existing_uids = {r.get("uid") for r in (existing.get("metadata") or {}).get("ownerReferences") or ()}
        wanted_uids = {r["uid"] for r in metadata.get("ownerReferences") or ()}
        if not _contains(body.get("spec"), existing.get("spec")) or not wanted_uids <= existing_uids:
            raise AlreadyExists(
                f'{self.type} "{metadata.get("name")}" already exists with another spec or owner', status=409
            )
        return self._parse(existing)

    async def patch(
        self,
        name: str,
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        namespace: str | None = None,
        patch_type: Literal["merge", "json"] = "merge",
    ) -> M:
        """Patch the object itself — its ``metadata`` (labels, annotations, owner references) or, for kinds
        whose spec is mutable, its spec (JSON merge patch, or a JSON patch list); never its status."""
        ns = self._namespace(namespace)
        return self._parse(
            await self._call(lambda c: c.patch(self.type, name, patch, namespace=ns, patch_type=patch_type))
        )

    async def _delete_at(self, name: str, namespace: str | None, resource_version: str | None) -> None:
        await self._call(lambda c: c.delete(self.type, name, namespace=namespace, resource_version=resource_version))

    async def patch_status(
        self,
        name: str,
        status: BaseModel | Mapping[str, Any],
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
    ) -> M:
        """Merge ``status`` into the object's status (JSON merge patch: a ``None`` value in a mapping removes that
        field; a model is dumped without its unset fields). With ``resource_version``, ``Conflict`` when the object
        changed since."""
        patch: dict[str, Any] = {"status": _dump(status)}
        if resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        ns = self._namespace(namespace)
        return self._parse(
            await self._call(lambda c: c.patch(self.type, name, patch, namespace=ns, subresource="status"))
        )

    async def replace_status(self, obj: M) -> M:
        """Write ``obj.status`` as the whole status, if the object is still at ``obj.metadata.resource_version``
        (``Conflict`` otherwise: re-read and decide again)."""
        body = obj.to_object()
        if self.type.namespaced:
            body.setdefault("metadata", {}).setdefault("namespace", self._runtime.namespace)
        return self._parse(await self._call(lambda c: c.update_status(self.type, body)))

    async def delete(
        self, name: str, *, namespace: str | None = None, uid: str | None = None, missing_ok: bool = False
    ) -> None:
        """Delete the object (and, through garbage collection, what it owns). ``uid``: only that incarnation
        (``Conflict`` when the name now holds another). ``missing_ok``: no ``NotFound`` when it is gone."""
        ns = self._namespace(namespace)
        try:
            if uid is None:
                await self._call(lambda c: c.delete(self.type, name, namespace=ns))
                return
            for _ in range(_DELETE_ATTEMPTS):
                current = await self.get(name, namespace=ns)
                if current.metadata.uid != uid:
                    raise Conflict(f'{self.type} "{name}" is another object now (uid {current.metadata.uid})')
                # The client's precondition is the resourceVersion: a write in between only means "read again".
                version = current.metadata.resource_version
                try:
                    await self._delete_at(name, ns, version)
                    return
                except Conflict:
                    continue
            raise Conflict(f'{self.type} "{name}" kept changing; not deleted after {_DELETE_ATTEMPTS} attempts')
        except NotFound:
            if not missing_ok:
                raise


class DomainReconciler(Protocol[M_contra]):
    """Reconciles objects of one kind. ``reconcile`` gets the object as last observed (typed) and may run any
    number of times for it; return ``Result(requeue_after=s)`` to look again later, or ``None``."""

    async def reconcile(self, obj: M_contra) -> Result | None: ...


DomainReconcileFunction = Callable[[M], Awaitable[Result | None]]


@dataclass(frozen=True, slots=True)
class DomainWatchSpec:
    """One ``rt.watch`` registration, turned into a controller when the runtime runs."""

    model: type[KubeObject]
    reconciler: Any
    owns: tuple[type[KubeObject], ...]
    workers: int
    leader_election: str | LeaderElection | None


class DomainController:
    """The reconcile-runtime face of one ``rt.watch``: reads the object from the informer's cache, skips objects
    that are gone or being deleted, and turns the runtime's errors into requeues with the key's backoff."""

    def __init__(self, spec: DomainWatchSpec, *, informer: Informer) -> None:
        self._spec = spec
        self._informer = informer
        method = getattr(spec.reconciler, "reconcile", None)
        self._reconcile: Callable[[Any], Awaitable[Result | None]] = method if callable(method) else spec.reconciler
        self._what = resource_type(spec.model).qualified_name

    async def reconcile(self, request: Request) -> Result:
        obj = self._informer.get(request.name, request.namespace)
        if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
            return Result()
        try:
            typed = self._spec.model.model_validate(obj)
        except ValidationError as exc:
            logger.warning("%s %s does not fit %s; skipped: %s", self._what, request, self._spec.model.__name__, exc)
            return Result()
        try:
            result = await self._reconcile(typed)
        except RuntimeApiError as exc:
            logger.warning("%s %s: %s %s; retrying with backoff", self._what, request, type(exc).__name__, exc.message)
            delay = exc.retry_after if isinstance(exc, CapacityFull) else None
            raise TemporaryError(f"{self._what} {request}: {exc.message}", delay=delay) from exc
        return result if result is not None else Result()


async def ensure_crds(
    client: ResourceClient, manifests: Iterable[Mapping[str, Any]], *, clock: Clock, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """Create each CRD, or update it when its spec differs from the manifest's, then wait until every one is
    ``Established`` (``Unavailable`` after ``timeout`` seconds). Returns the CRDs as the API holds them."""
    names: list[str] = []
    try:
        for manifest in manifests:
            name = str((manifest.get("metadata") or {}).get("name") or "")
            if not name:
                raise ValueError("a CRD manifest needs metadata.name")
            names.append(name)
            await _apply_crd(client, name, manifest)
        deadline = clock.monotonic() + timeout
        established: list[dict[str, Any]] = []
        for name in names:
            while True:
                crd = await client.get(CRDS, name)
                if _established(crd):
                    established.append(crd)
                    break
                if clock.monotonic() >= deadline:
                    raise Unavailable(f"the CustomResourceDefinition {name} is not Established after {timeout:g} s")
                await clock.sleep(0.2)
        return established
    except ResourceError as exc:
        raise error_from_resource(exc) from exc


_APPLY_ATTEMPTS = 5
"""Races with another replica applying the same CRD (409 on create or update) are retried this often."""


async def _apply_crd(client: ResourceClient, name: str, manifest: Mapping[str, Any]) -> None:
    """Create the CRD, or update it when its spec differs; another process doing the same at the same time (two
    replicas of one operator starting together) costs a re-read, never an error."""
    for attempt in range(_APPLY_ATTEMPTS):
        last = attempt == _APPLY_ATTEMPTS - 1
        try:
            existing = await client.get(CRDS, name)
        except ResourceError as exc:
            if exc.code != 404:
                raise
            try:
                await client.create(CRDS, dict(manifest))
            except ResourceError as created:
                if created.code != 409 or last:  # AlreadyExists: the other one was first; compare with its copy
                    raise
                continue
            return
        if _contains(manifest.get("spec"), existing.get("spec")):
            return
        try:
            await client.update(CRDS, {**existing, "spec": dict(manifest.get("spec") or {})})
        except ResourceError as exc:
            if exc.code != 409 or last:  # Conflict: someone updated it since our read
                raise
            continue
        return


def _established(crd: Mapping[str, Any]) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
