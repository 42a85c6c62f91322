"""Who may do what on the Kubernetes-compatible API.

Two kinds of caller hold a bearer token:

* the **admin** (the data directory's token): every verb on every resource, as before;
* a **responder** (an operator or harness token issued by loop-server, resolved through a `TokenResolver`): what
  a responder running in its own process needs and no more —

  ====================================  ===========================================================
  resource                              verbs
  ====================================  ===========================================================
  every kind                            get, list, watch (Tasks hold routing only, never content)
  ``leases`` (coordination.k8s.io)      every verb (leader election)
  ``tasks`` status subresource          update, patch — only Tasks whose ``spec.target`` is the caller
  its domain group ``<key>.loopd.dev``  every verb — an operator's own kinds (e.g. ``operator:longhorizon``:
  (and its subdomains)                  runs, executions, audits of ``longhorizon.loopd.dev``)
  ``customresourcedefinitions``         create, update, patch — only CRDs of the operator's domain group
  anything else                         403 Forbidden
  ====================================  ===========================================================

Must not do: authenticate (``_api`` compares tokens) or know how tokens are issued (the resolver does).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ._errors import Forbidden

TokenResolver = Callable[[str], Awaitable[str | None]]
"""A bearer token that is not the admin's → the responder it was issued to (``operator:<key>`` / ``harness:<key>``),
or None when it is no token of this server."""

READ_METHODS: Final = frozenset({"GET", "HEAD"})
LEASE_GROUP: Final = "coordination.k8s.io"
TASK_GROUP: Final = "loopd.dev"
CRD_GROUP: Final = "apiextensions.k8s.io"
CRD_WRITE_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated caller of the API: the admin, or one responder (``actor`` = ``kind:key``)."""

    actor: str | None = None

    @property
    def admin(self) -> bool:
        return self.actor is None


ADMIN: Final = Caller()


def operator_domain(caller: Caller) -> str | None:
    """The API group an operator owns (``operator:longhorizon`` → ``longhorizon.loopd.dev``); None for others."""
    kind, _, key = (caller.actor or "").partition(":")
    return f"{key}.{TASK_GROUP}" if kind == "operator" and key else None


def in_domain(group: str, domain: str) -> bool:
    """Whether ``group`` is ``domain`` or one of its subdomains."""
    return group == domain or group.endswith("." + domain)


def check_verb(
    caller: Caller, *, method: str, group: str, resource: str, subresource: str | None, name: str | None = None
) -> bool:
    """Whether ``caller`` may use ``method`` here at all; ``True`` when the answer depends on the object (a Task
    status write: see `check_task_target`). A CRD created by an operator is checked by `check_crd_body` once its
    body is read. Raises `Forbidden` otherwise."""
    if caller.admin or method in READ_METHODS:
        return False
    if group == LEASE_GROUP and resource == "leases":
        return False
    if group == TASK_GROUP and resource == "tasks" and subresource == "status" and method in ("PUT", "PATCH"):
        return True
    domain = operator_domain(caller)
    if domain is not None and in_domain(group, domain):
        return False
    if (
        domain is not None
        and group == CRD_GROUP
        and resource == "customresourcedefinitions"
        and subresource is None
        and method in CRD_WRITE_METHODS
        and (name is None or in_domain(name.partition(".")[2], domain))
    ):
        return False
    raise Forbidden(
        f"{resource}{'/' + subresource if subresource else ''}{' ' + repr(name) if name else ''} is forbidden: "
        f"{caller.actor} may read resources, write leases, the status of Tasks addressed to it"
        + (f", and objects and CRDs of the group {domain}" if domain else "")
    )


def check_crd_body(caller: Caller, crd: Mapping[str, Any]) -> None:
    """An operator creates only CRDs of its own domain group (`Forbidden` otherwise)."""
    if caller.admin:
        return
    domain = operator_domain(caller)
    spec = crd.get("spec")
    group = spec.get("group") if isinstance(spec, Mapping) else None
    metadata = crd.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if (
        domain is None
        or not isinstance(group, str)
        or not in_domain(group, domain)
        or not isinstance(name, str)
        or not in_domain(name.partition(".")[2], domain)
    ):
        raise Forbidden(
            f"customresourcedefinitions {name!r} is forbidden: {caller.actor} may create CRDs of the group "
            f"{domain or '(none)'} only"
        )


def task_target(task: Mapping[str, Any]) -> str | None:
    """``kind:key`` of a Task's ``spec.target`` (None when malformed)."""
    spec = task.get("spec")
    target = spec.get("target") if isinstance(spec, Mapping) else None
    if not isinstance(target, Mapping):
        return None
    kind, key = target.get("kind"), target.get("key")
    return f"{kind}:{key}" if isinstance(kind, str) and isinstance(key, str) else None


def check_task_target(caller: Caller, task: Mapping[str, Any]) -> None:
    """A responder writes only the status of Tasks addressed to it (`Forbidden` otherwise)."""
    if caller.admin:
        return
    if task_target(task) != caller.actor:
        name = (task.get("metadata") or {}).get("name", "?")
        raise Forbidden(f"tasks {name!r} is forbidden: it is not addressed to {caller.actor}")
