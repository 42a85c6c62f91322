"""The public faces of the client and the runtime: exactly these names."""

from __future__ import annotations

import loopd.resources.client as client
import loopd.resources.reconcile as reconcile


def test_client_public_names() -> None:
    assert sorted(client.__all__) == sorted(
        [
            "LEASES",
            "TASKS",
            "TASK_TARGET_KEY_LABEL",
            "TASK_TARGET_KIND_LABEL",
            "HttpResourceClient",
            "InMemoryClient",
            "JsonObject",
            "PatchType",
            "ResourceClient",
            "ResourceType",
            "ServerError",
            "StoreClient",
            "TooManyRequests",
            "TransportError",
            "error_from_response",
            "name_of",
            "namespace_of",
            "open_http_client",
            "resource_version_of",
            "task_target_labels",
            "tasks_not_for",
        ]
    )
    for name in client.__all__:
        assert getattr(client, name) is not None


def test_reconcile_public_names() -> None:
    assert sorted(reconcile.__all__) == sorted(
        [
            "Backoff",
            "Clock",
            "Controller",
            "ControllerStatistics",
            "EventFilter",
            "Informer",
            "InformerEvent",
            "InformerStatistics",
            "LeaderElection",
            "LeaderElector",
            "LeaderStatistics",
            "Manager",
            "ManagerStatistics",
            "PermanentError",
            "QueueShutDown",
            "QueueStatistics",
            "ReconcileError",
            "ReconcileFunction",
            "Reconciler",
            "Request",
            "Result",
            "SystemClock",
            "TemporaryError",
            "VirtualClock",
            "ignore_status_updates",
            "Watch",
            "WorkQueue",
            "owner_requests",
        ]
    )
    for name in reconcile.__all__:
        assert getattr(reconcile, name) is not None


def test_every_private_module_states_what_it_owns_and_must_not_do() -> None:
    import importlib
    import pkgutil

    for package in (client, reconcile):
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            doc = module.__doc__ or ""
            assert "Owns:" in doc and "Must not do:" in doc, module.__name__
