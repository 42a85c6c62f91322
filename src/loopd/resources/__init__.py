"""Kubernetes-shaped resources for loopd: object model and kinds, the embedded store, the compatible API.

Public face only; implementation lives in private modules. See ``README_API.md`` for the contract.
This package never imports loopd.server, loopd.harness, loopd.runtime, loopd.operators or loopd.cli.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._api import ResourceApi, create_api_app
from ._api_access import TokenResolver
from ._builtin_kinds import (
    CRD_KIND,
    LEASE_KIND,
    NAMESPACE_KIND,
    TASK_KIND,
    Lease,
    LeaseSpec,
    Task,
    TaskCondition,
    TaskSpec,
    TaskStatus,
    TaskTarget,
    builtin_crds,
    builtin_kind_specs,
)
from ._credentials import ApiCredentials, load_or_create_credentials, read_endpoint, write_endpoint
from ._errors import (
    AlreadyExists,
    BadRequest,
    Cause,
    Conflict,
    ErrorDetails,
    Forbidden,
    Gone,
    Invalid,
    MethodNotAllowed,
    NotFound,
    RequestTooLarge,
    ResourceError,
    StoreUnavailable,
    Unauthorized,
    UnsupportedMediaType,
    error_from_status,
)
from ._kinds import KindRef, KindRegistry, KindSpec, PrinterColumn
from ._models import KindDeclaration, KubeObject, ObjectMeta, OwnerReference, WireModel, crd_from_model
from ._patching import PatchType, apply_patch
from ._selectors import FieldSelector, LabelSelector
from ._serving import ApiServer, open_api_server, render_kubeconfig
from ._store import (
    FieldValidation,
    ObjectList,
    PropagationPolicy,
    ResourceStore,
    StoreOptions,
    WatchEvent,
    WatchEventType,
    WatchStream,
)
from ._store_memory import MemoryResourceStore
from ._store_sqlite import SqliteResourceStore, open_sqlite_store

if TYPE_CHECKING:
    from ._store_postgres import PostgresResourceStore, open_postgres_store

__all__ = [
    "CRD_KIND",
    "LEASE_KIND",
    "NAMESPACE_KIND",
    "TASK_KIND",
    "AlreadyExists",
    "ApiCredentials",
    "ApiServer",
    "BadRequest",
    "Cause",
    "Conflict",
    "ErrorDetails",
    "FieldSelector",
    "FieldValidation",
    "Forbidden",
    "Gone",
    "Invalid",
    "KindDeclaration",
    "KindRef",
    "KindRegistry",
    "KindSpec",
    "KubeObject",
    "LabelSelector",
    "Lease",
    "LeaseSpec",
    "MemoryResourceStore",
    "MethodNotAllowed",
    "NotFound",
    "ObjectList",
    "ObjectMeta",
    "OwnerReference",
    "PatchType",
    "PostgresResourceStore",
    "PrinterColumn",
    "PropagationPolicy",
    "RequestTooLarge",
    "ResourceApi",
    "ResourceError",
    "ResourceStore",
    "SqliteResourceStore",
    "StoreOptions",
    "StoreUnavailable",
    "Task",
    "TaskCondition",
    "TaskSpec",
    "TaskStatus",
    "TaskTarget",
    "TokenResolver",
    "Unauthorized",
    "UnsupportedMediaType",
    "WatchEvent",
    "WatchEventType",
    "WatchStream",
    "WireModel",
    "apply_patch",
    "builtin_crds",
    "builtin_kind_specs",
    "crd_from_model",
    "create_api_app",
    "error_from_status",
    "load_or_create_credentials",
    "open_api_server",
    "open_postgres_store",
    "open_sqlite_store",
    "read_endpoint",
    "render_kubeconfig",
    "write_endpoint",
]

_LAZY = {"PostgresResourceStore", "open_postgres_store"}


def __getattr__(name: str) -> Any:
    # The PostgreSQL store needs the optional 'postgres' extra; import it only when asked for.
    if name in _LAZY:
        from . import _store_postgres

        return getattr(_store_postgres, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
