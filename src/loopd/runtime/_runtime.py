"""``open_runtime`` and ``Runtime``: one operator process's connection to loopd, its registration, its watches.

Owns: the lifetime of the HTTP client, the background renewal of registrations (a ``TaskSet`` that ends with the
runtime), the resource client used by watches and domain verbs (given, or opened from a kubeconfig on first use and
closed with the runtime), and the reconcile managers (one per leader-election Lease) that ``run()`` drives until
cancelled or ``shutdown()``.
Must not do: import loopd.server / loopd.harness, or talk to the server other than through its HTTP API.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx

from loopd._infra.clock import Clock, SystemClock
from loopd._infra.errors import LoopdError
from loopd._infra.metrics import Metrics
from loopd._infra.tasks import TaskSet
from loopd.resources import KubeObject
from loopd.resources.client import TASKS, ResourceClient, open_http_client, tasks_not_for
from loopd.resources.reconcile import LeaderElection, Manager, Watch, owner_requests

from ._chat import ChatVerbs
from ._client import Endpoint, ServerClient, find_endpoint
from ._domain import (
    DomainController,
    DomainReconcileFunction,
    DomainReconciler,
    DomainWatchSpec,
    ResourceVerbs,
    ensure_crds,
    resource_type,
)
from ._harness import HarnessVerbs
from ._human import HumanVerbs
from ._records import Registration
from ._tasks import AnsweredTasks, TaskController, TaskVerbs, WatchSpec

logger = logging.getLogger("loopd.runtime")

M = TypeVar("M", bound=KubeObject)


class Runtime:
    """The verbs (``rt.task``, ``rt.chat``, ``rt.harness``, ``rt.human``), ``register`` and ``run``; made by
    ``open_runtime``. A runtime acts as one responder (``actor``, ``operator:<key>``): the first ``register`` or
    ``task.watch`` names it unless ``open_runtime(actor=...)`` did."""

    def __init__(
        self,
        client: ServerClient,
        *,
        clock: Clock,
        namespace: str,
        resources: ResourceClient | None,
        kubeconfig: str | Path | Mapping[str, Any] | None,
        background: TaskSet,
    ) -> None:
        self._client = client
        self._clock = clock
        self._namespace = namespace
        self._resources = resources
        self._kubeconfig = kubeconfig
        self._background = background
        self._watches: list[WatchSpec] = []
        self._domain_watches: list[DomainWatchSpec] = []
        self._verbs: dict[type[KubeObject], ResourceVerbs[Any]] = {}
        self._resource_stack = AsyncExitStack()
        self._resource_lock = asyncio.Lock()
        self._renewals: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._managers: list[Manager] = []
        self._metrics: tuple[Metrics, str] | None = None  # where reconciles are reported, under which component
        self._stopping = asyncio.Event()
        self._started = False
        self._answered = AnsweredTasks()
        self.task = TaskVerbs(self, client)
        self.chat = ChatVerbs(client, self._answered)
        self.harness = HarnessVerbs(client, clock)
        self.human = HumanVerbs(client, clock)

    @property
    def endpoint(self) -> Endpoint:
        """The server, credential and embedded Kubernetes API this runtime uses."""
        return self._client.endpoint

    @property
    def actor(self) -> str | None:
        """``kind:key`` this runtime acts as (None until named)."""
        return self._client.actor

    @property
    def namespace(self) -> str:
        """The namespace of this runtime's Tasks, Leases and (by default) domain objects."""
        return self._namespace

    @property
    def clock(self) -> Clock:
        """The clock of every wait, renewal and backoff of this runtime."""
        return self._clock

    @property
    def managers(self) -> tuple[Manager, ...]:
        """The reconcile managers while ``run()`` runs (for their ``statistics()``)."""
        return tuple(self._managers)

    def report_metrics(self, metrics: Metrics, component: str) -> None:
        """Report this runtime's reconciles (latency, queue depth, in flight) into ``metrics`` under ``component``
        (e.g. the operator's key); call it before ``run()``."""
        self._metrics = (metrics, component)
        metrics.add_reconcile_source(component, lambda: [load for m in self._managers for load in m.loads()])

    def act_as(self, kind: str, key: str) -> None:
        """Name the responder this runtime acts as (``ValueError`` if it already acts as another)."""
        actor = f"{kind}:{key}"
        if self._client.actor is None:
            self._client.actor = actor
        elif self._client.actor != actor:
            raise ValueError(f"this runtime acts as {self._client.actor}; open another runtime for {actor}")

    # -- registration --------------------------------------------------------------------------------------

    async def register(
        self,
        key: str,
        *,
        display_name: str = "",
        description: str = "",
        lease_seconds: float = 30.0,
        kind: str = "operator",
    ) -> Registration:
        """Register ``kind:key`` (listed in ``/v1/actors`` and the web picker) and keep it registered: renewed in
        the background every ``lease_seconds / 3`` until the runtime closes. The first registration's errors are
        raised; a failed renewal is logged and tried again (it never stops the operator)."""
        if not lease_seconds > 0:
            raise ValueError("lease_seconds must be positive")
        self.act_as(kind, key)
        body = {"display_name": display_name, "description": description, "lease_seconds": lease_seconds}
        registration = await self._put_registration(kind, key, body)
        previous = self._renewals.pop((kind, key), None)
        if previous is not None:
            previous.cancel()
        self._renewals[(kind, key)] = self._background.start(
            self._renew(kind, key, body, lease_seconds), name=f"register:{kind}:{key}"
        )
        return registration

    async def _put_registration(self, kind: str, key: str, body: Mapping[str, Any]) -> Registration:
        path = f"/v1/{'operators' if kind == 'operator' else 'harnesses'}/{key}"
        answer = await self._client.request("PUT", path, json=body, what=f"register {kind}:{key}")
        return Registration.from_json(answer)

    async def _renew(self, kind: str, key: str, body: Mapping[str, Any], lease_seconds: float) -> None:
        period = lease_seconds / 3
        failures = 0
        while True:
            # After a failure, try again sooner (but no more often than every period/4) to keep the lease alive.
            await self._clock.sleep(period if failures == 0 else max(period / 4, 0.05))
            try:
                await self._put_registration(kind, key, body)
            except (LoopdError, httpx.HTTPError) as exc:
                failures += 1
                logger.warning("renewing the registration of %s:%s failed (%d in a row): %s", kind, key, failures, exc)
            else:
                if failures:
                    logger.info("the registration of %s:%s is renewed again", kind, key)
                failures = 0

    # -- domain resources ----------------------------------------------------------------------------------

    def resources(self, model: type[M]) -> ResourceVerbs[M]:
        """Typed verbs for one kind of domain resource (``rt.resources(Run).get(name)``): get, find, list, create
        (with an owner), patch_status, replace_status, delete. Errors are this runtime's tree."""
        verbs = self._verbs.get(model)
        if verbs is None:
            verbs = self._verbs[model] = ResourceVerbs(self, model)
        return verbs

    async def ensure_crds(
        self, manifests: Iterable[Mapping[str, Any]], *, timeout: float = 30.0
    ) -> list[dict[str, Any]]:
        """Create the CustomResourceDefinitions, or update those whose spec differs, and wait until every one is
        Established (``Unavailable`` after ``timeout`` s). An operator token may write CRDs of its own group only
        (``<key>.loopd.dev`` on the embedded API; a real cluster decides by its RBAC)."""
        client = await self.resource_client()
        return await ensure_crds(client, manifests, clock=self._clock, timeout=timeout)

    async def resource_client(self) -> ResourceClient:
        """The Kubernetes API client of this runtime: the one given to ``open_runtime``, or one opened (once) from
        the kubeconfig / the data directory's embedded API and closed with the runtime."""
        if self._resources is not None:
            return self._resources
        async with self._resource_lock:
            if self._resources is None:
                kubeconfig = self._kubeconfig
                if kubeconfig is None and self.endpoint.api_url is not None and self.endpoint.ca_file is not None:
                    kubeconfig = self.endpoint.kubeconfig(self._namespace)
                self._resources = await self._resource_stack.enter_async_context(
                    open_http_client(kubeconfig, request_timeout=self._client.request_timeout)
                )
            return self._resources

    async def aclose(self) -> None:
        """Close what the runtime opened for itself (the resource client). ``open_runtime`` calls it."""
        await self._resource_stack.aclose()

    def watch(
        self,
        model: type[M],
        reconciler: DomainReconciler[M] | DomainReconcileFunction[M],
        *,
        owns: Iterable[type[KubeObject]] = (),
        workers: int = 4,
        leader_election: str | LeaderElection | None = None,
    ) -> None:
        """Reconcile every ``model`` object of the runtime's namespace with ``reconciler`` (at most ``workers`` at
        once) once ``rt.run()`` runs; a change of an object of an ``owns`` kind whose controlling owner is one of
        them wakes that owner. ``leader_election``: a Lease name — watches naming the same Lease (``task.watch``
        too) run in one manager, only while this replica holds it. Call before ``run()``."""
        if workers < 1:
            raise ValueError("workers must be at least 1")
        if self._started:
            raise RuntimeError("rt.watch must be called before rt.run()")
        self._domain_watches.append(DomainWatchSpec(model, reconciler, tuple(owns), workers, leader_election))

    # -- watches -------------------------------------------------------------------------------------------

    def add_watch(self, spec: WatchSpec) -> None:
        """Used by ``task.watch``."""
        if self._started:
            raise RuntimeError("task.watch must be called before rt.run()")
        self.act_as(spec.kind, spec.key)
        self._watches.append(spec)

    async def run(self) -> None:
        """Run every ``task.watch`` on the reconcile runtime until ``shutdown()`` (in-flight reconciles drain, then
        leases are released) or cancelled (in-flight reconciles are cancelled at once: their harness calls go on in
        the server and a later run re-attaches). Without watches it just keeps the registrations alive."""
        if self._started:
            raise RuntimeError("a runtime runs once")
        self._started = True
        if self._watches or self._domain_watches:
            self._managers = self._build_managers(await self.resource_client())
        async with asyncio.TaskGroup() as group:
            for manager in self._managers:
                group.create_task(manager.run(), name="loopd-runtime-manager")
            await self._stopping.wait()
            for manager in self._managers:
                manager.shutdown()

    def shutdown(self) -> None:
        """Ask ``run()`` to stop gracefully and return."""
        self._stopping.set()

    def _build_managers(self, resources: ResourceClient) -> list[Manager]:
        groups: dict[object, tuple[LeaderElection | None, list[WatchSpec | DomainWatchSpec]]] = {}
        every: list[WatchSpec | DomainWatchSpec] = [*self._watches, *self._domain_watches]
        for spec in every:
            election = spec.leader_election
            if isinstance(election, str):
                group_key: object = election
                if group_key not in groups:
                    groups[group_key] = (LeaderElection(election, namespace=self._namespace), [])
            else:
                group_key = election
                groups.setdefault(group_key, (election, []))
            groups[group_key][1].append(spec)
        managers: list[Manager] = []
        for election, specs in groups.values():
            observer = self._metrics[0].reconcile_observer(self._metrics[1]) if self._metrics is not None else None
            manager = Manager(resources, leader_election=election, clock=self._clock, on_reconciled=observer)
            for spec in specs:
                if isinstance(spec, WatchSpec):
                    # Selected on the server: the harnesses' Tasks (most of a chat server's) never reach us.
                    selector = tasks_not_for("operator" if spec.kind == "harness" else "harness")
                    informer = manager.informer(TASKS, namespace=self._namespace, label_selector=selector)
                    controller = TaskController(
                        spec, informer=informer, resources=resources, clock=self._clock, answered=self._answered
                    )
                    manager.add_controller(
                        TASKS,
                        controller.reconcile,
                        name=f"tasks:{spec.kind}:{spec.key}",
                        namespace=self._namespace,
                        label_selector=selector,
                        workers=spec.workers,
                    )
                    continue
                primary = resource_type(spec.model)
                domain = DomainController(spec, informer=manager.informer(primary, namespace=self._namespace))
                manager.add_controller(
                    primary,
                    domain.reconcile,
                    name=f"{primary.qualified_name}",
                    namespace=self._namespace,
                    workers=spec.workers,
                    watches=[
                        Watch(resource_type(owned), owner_requests(primary), namespace=self._namespace)
                        for owned in spec.owns
                    ],
                )
            managers.append(manager)
        return managers


@asynccontextmanager
async def open_runtime(
    server_url: str | None = None,
    *,
    token: str | None = None,
    data_dir: str | Path | None = None,
    resources: ResourceClient | None = None,
    kubeconfig: str | Path | Mapping[str, Any] | None = None,
    namespace: str = "default",
    clock: Clock | None = None,
    request_timeout: float = 30.0,
    actor: str | None = None,
    retries: int = 3,
    transport: httpx.AsyncBaseTransport | None = None,
) -> AsyncIterator[Runtime]:
    """Connect an operator to loopd for the block's duration.

    The server: ``server_url`` with ``token`` (an operator token from `loopd token create operator:<key>`), or
    ``data_dir`` of a running `loopd up` (its ``server.json`` and admin token; the runtime then acts as the operator
    it registers or watches through ``X-Loopd-Actor``). Tasks: ``resources`` (any ``ResourceClient``), else a client
    opened from ``kubeconfig`` (a path or a parsed kubeconfig), else the data directory's embedded Kubernetes API
    over TLS, else ``$KUBECONFIG`` / ``~/.kube/config`` / in-cluster — opened only if ``run()`` has watches.
    Every HTTP call is bounded by ``request_timeout``. On exit registrations stop being renewed (they lapse).
    """
    endpoint = find_endpoint(server_url, token=token, data_dir=data_dir)
    the_clock = clock or SystemClock()
    client = ServerClient(
        endpoint, clock=the_clock, request_timeout=request_timeout, retries=retries, actor=actor, transport=transport
    )
    try:
        async with TaskSet("loopd runtime") as background:
            runtime = Runtime(
                client,
                clock=the_clock,
                namespace=namespace,
                resources=resources,
                kubeconfig=kubeconfig,
                background=background,
            )
            try:
                yield runtime
            finally:
                await runtime.aclose()
    finally:
        await client.aclose()
