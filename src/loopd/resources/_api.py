"""The Kubernetes-compatible REST API as an ASGI app over any ``ResourceStore``.

Owns: routing of ``/version``, ``/api``, ``/apis``, ``/openapi``; bearer-token auth (the admin token, or a
responder's token through a `TokenResolver`, with what each may do in ``_api_access``); request parsing (query
options, bodies, patch content types, body size limit); content negotiation (JSON, ``Table``, aggregated
discovery); watch streams; mapping every ``ResourceError`` to a Kubernetes ``Status`` body.
Must not do: object semantics (the store decides) or TLS / process management (``_serving``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from loopd._infra.clock import Clock, SystemClock

from . import _api_discovery as discovery
from ._api_access import ADMIN, CRD_GROUP, Caller, TokenResolver, check_crd_body, check_task_target, check_verb
from ._api_tables import IncludeObject, table
from ._api_watch import WatchResponse
from ._errors import (
    BadRequest,
    Cause,
    MethodNotAllowed,
    NotFound,
    RequestTooLarge,
    ResourceError,
    Unauthorized,
    UnsupportedMediaType,
)
from ._kinds import KindSpec
from ._patching import PATCH_CONTENT_TYPES, apply_patch
from ._store import FieldValidation, PropagationPolicy, ResourceStore
from ._validation import invalid_error, unknown_fields

_log = logging.getLogger(__name__)

_PUBLIC_PATHS = {"/version", "/healthz", "/livez", "/readyz"}
_DISCOVERY_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
_DISCOVERY_V2BETA1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
DEFAULT_MAX_BODY = 3 * 1024 * 1024


class _JSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def status_response(error: ResourceError) -> Response:
    return _JSON(error.to_status(), status_code=error.code)


def _media_ranges(accept: str) -> list[dict[str, str]]:
    ranges = []
    for part in accept.split(","):
        pieces = [p.strip() for p in part.split(";")]
        params = {"type": pieces[0].lower()}
        for piece in pieces[1:]:
            key, _, value = piece.partition("=")
            params[key.strip().lower()] = value.strip()
        ranges.append(params)
    return ranges


def _wants(accept: str, as_kind: str, group: str) -> dict[str, str] | None:
    for media in _media_ranges(accept):
        if media.get("as") == as_kind and media.get("g") == group:
            return media
    return None


@dataclass(frozen=True)
class _Target:
    spec: KindSpec
    namespace: str | None
    name: str | None
    subresource: Literal["status"] | None

    @property
    def item_name(self) -> str:
        if self.name is None:
            raise MethodNotAllowed("this verb needs an object name")
        return self.name


class ResourceApi:
    """ASGI app serving a ``ResourceStore`` the way kube-apiserver serves resources."""

    def __init__(
        self,
        store: ResourceStore,
        *,
        token: str | None,
        max_body_bytes: int = DEFAULT_MAX_BODY,
        body_timeout: float = 30.0,
        resolve_token: TokenResolver | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._store = store
        self._clock = clock or SystemClock()  # the Age column of Table responses
        self._token = token
        self._resolve_token = resolve_token
        self._max_body = max_body_bytes
        self._body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        try:
            response: Response | WatchResponse = await self._dispatch(request)
        except ResourceError as exc:
            response = status_response(exc)
        except Exception:
            _log.exception("resource API: unexpected error on %s %s", request.method, request.url.path)
            response = status_response(ResourceError("an internal error occurred"))
        await response(scope, receive, send)

    # -- routing -----------------------------------------------------------------------------------------------

    async def _dispatch(self, request: Request) -> Response | WatchResponse:
        path = "/" + request.url.path.strip("/")
        if path in _PUBLIC_PATHS:
            if path == "/version":
                return _JSON(discovery.SERVER_VERSION)
            return PlainTextResponse("ok")
        caller = await self._authenticate(request)
        parts = [p for p in path.split("/") if p]
        if not parts:
            return _JSON({"paths": ["/api", "/api/v1", "/apis", "/openapi/v3", "/version"]})
        if parts[0] == "openapi":
            return self._openapi(parts[1:])
        if parts[0] == "api":
            return await self._core(request, parts[1:], caller)
        if parts[0] == "apis":
            return await self._groups(request, parts[1:], caller)
        raise NotFound("the server could not find the requested resource")

    async def _authenticate(self, request: Request) -> Caller:
        if self._token is None:
            return ADMIN
        header = request.headers.get("authorization", "")
        scheme, _, credentials = header.partition(" ")
        given = credentials.strip()
        if scheme.lower() != "bearer" or not given:
            raise Unauthorized("Unauthorized")
        if hmac.compare_digest(given.encode(), self._token.encode()):
            return ADMIN
        actor = await self._resolve_token(given) if self._resolve_token is not None else None
        if actor is None:
            raise Unauthorized("Unauthorized")
        return Caller(actor)

    def _openapi(self, rest: list[str]) -> Response:
        registry = self._store.registry
        if rest == ["v3"]:
            return _JSON(discovery.openapi_index(registry))
        if len(rest) == 3 and rest[:2] == ["v3", "api"]:
            document = discovery.openapi_document(registry, "", rest[2])
        elif len(rest) == 4 and rest[:2] == ["v3", "apis"]:
            document = discovery.openapi_document(registry, rest[2], rest[3])
        else:
            document = None
        if document is None:
            raise NotFound("the server could not find the requested resource")
        return _JSON(document)

    def _discovery_list(self, request: Request, *, core: bool) -> Response | None:
        accept = request.headers.get("accept", "")
        media = _wants(accept, "APIGroupDiscoveryList", "apidiscovery.k8s.io")
        if media is None:
            return None
        for candidate in _media_ranges(accept):
            if candidate.get("as") != "APIGroupDiscoveryList":
                continue
            version = candidate.get("v")
            if version in ("v2", "v2beta1"):
                content_type = _DISCOVERY_V2 if version == "v2" else _DISCOVERY_V2BETA1
                body = discovery.aggregated_discovery(
                    self._store.registry, core=core, api_version=f"apidiscovery.k8s.io/{version}"
                )
                return Response(
                    json.dumps(body, separators=(",", ":")).encode(),
                    media_type=content_type,
                    headers={"Vary": "Accept"},
                )
        return None

    async def _core(self, request: Request, rest: list[str], caller: Caller) -> Response | WatchResponse:
        if not rest:
            aggregated = self._discovery_list(request, core=True)
            if aggregated is not None:
                return aggregated
            return _JSON(discovery.api_versions(request.headers.get("host", "127.0.0.1")))
        if rest[0] != "v1":
            raise NotFound("the server could not find the requested resource")
        if len(rest) == 1:
            return self._resource_list("", "v1")
        return await self._resource(request, self._target(request, "", "v1", rest[1:]), caller)

    async def _groups(self, request: Request, rest: list[str], caller: Caller) -> Response | WatchResponse:
        registry = self._store.registry
        if not rest:
            aggregated = self._discovery_list(request, core=False)
            if aggregated is not None:
                return aggregated
            return _JSON(discovery.api_group_list(registry))
        if len(rest) == 1:
            group = discovery.api_group(registry, rest[0])
            if group is None:
                raise NotFound("the server could not find the requested resource")
            return _JSON(group)
        if len(rest) == 2:
            return self._resource_list(rest[0], rest[1])
        return await self._resource(request, self._target(request, rest[0], rest[1], rest[2:]), caller)

    def _resource_list(self, group: str, version: str) -> Response:
        document = discovery.api_resource_list(self._store.registry, group, version)
        if document is None:
            raise NotFound("the server could not find the requested resource")
        return _JSON(document)

    def _target(self, request: Request, group: str, version: str, segments: list[str]) -> _Target:
        namespace: str | None = None
        if segments[0] == "namespaces" and len(segments) >= 3 and segments[2] not in ("status", "finalize"):
            namespace, segments = segments[1], segments[2:]
        if len(segments) > 3:
            raise NotFound("the server could not find the requested resource")
        spec = self._store.registry.by_resource(group, version, segments[0])
        name = segments[1] if len(segments) > 1 else None
        subresource = segments[2] if len(segments) > 2 else None
        if subresource is not None and (subresource != "status" or not spec.status_subresource):
            raise NotFound("the server could not find the requested resource")
        if namespace is not None and not spec.namespaced:
            raise NotFound("the server could not find the requested resource")
        if namespace is None and spec.namespaced and name is not None:
            raise NotFound("the server could not find the requested resource")
        return _Target(spec, namespace, name, "status" if subresource else None)

    # -- resource verbs ----------------------------------------------------------------------------------------

    async def _resource(self, request: Request, target: _Target, caller: Caller) -> Response | WatchResponse:
        method = request.method
        spec = target.spec
        if check_verb(
            caller,
            method=method,
            group=spec.group,
            resource=spec.plural,
            subresource=target.subresource,
            name=target.name,
        ):
            # Spec cannot change through the status subresource, so the target read here is the one written.
            current = await self._store.get(spec.ref, target.item_name, namespace=target.namespace)
            check_task_target(caller, current)
        if target.name is None:
            if method == "GET":
                if _flag(request.query_params.get("watch")):
                    return self._watch(request, target)
                return await self._list(request, target)
            if method == "POST":
                return await self._create(request, target, caller)
            raise MethodNotAllowed(f"{method} is not supported on a collection")
        if method == "GET":
            obj = await self._store.get(target.spec.ref, target.name, namespace=target.namespace)
            return self._object_response(request, target.spec, obj)
        if method == "PUT":
            return await self._replace(request, target)
        if method == "PATCH":
            return await self._patch(request, target)
        if method == "DELETE" and target.subresource is None:
            return await self._delete(request, target)
        raise MethodNotAllowed(f"{method} is not supported here")

    def _object_response(self, request: Request, spec: KindSpec, obj: dict[str, Any], status: int = 200) -> Response:
        if self._table_requested(request):
            rv = str(obj.get("metadata", {}).get("resourceVersion", ""))
            rendered = table(spec, [obj], resource_version=rv, include=_include(request), now=self._clock.now())
            return _JSON(rendered, status_code=status)
        return _JSON(obj, status_code=status)

    @staticmethod
    def _table_requested(request: Request) -> bool:
        return _wants(request.headers.get("accept", ""), "Table", "meta.k8s.io") is not None

    async def _list(self, request: Request, target: _Target) -> Response:
        query = request.query_params
        result = await self._store.list(
            target.spec.ref,
            namespace=target.namespace,
            label_selector=query.get("labelSelector"),
            field_selector=query.get("fieldSelector"),
            limit=_int(query.get("limit"), "limit"),
            continue_token=query.get("continue") or None,
        )
        if self._table_requested(request):
            return _JSON(
                table(
                    target.spec,
                    result.items,
                    resource_version=result.resource_version,
                    include=_include(request),
                    continue_token=result.continue_token,
                    now=self._clock.now(),
                )
            )
        metadata: dict[str, Any] = {"resourceVersion": result.resource_version}
        if result.continue_token:
            metadata["continue"] = result.continue_token
        if result.remaining_item_count is not None:
            metadata["remainingItemCount"] = result.remaining_item_count
        return _JSON(
            {
                "apiVersion": target.spec.api_version,
                "kind": target.spec.list_kind_name,
                "metadata": metadata,
                "items": result.items,
            }
        )

    def _watch(self, request: Request, target: _Target) -> WatchResponse:
        query = request.query_params
        timeout = _int(query.get("timeoutSeconds"), "timeoutSeconds")
        stream = self._store.watch(
            target.spec.ref,
            namespace=target.namespace,
            resource_version=query.get("resourceVersion") or None,
            label_selector=query.get("labelSelector"),
            field_selector=query.get("fieldSelector"),
            bookmarks=_flag(query.get("allowWatchBookmarks")),
        )
        return WatchResponse(
            stream,
            spec=target.spec,
            as_table=self._table_requested(request),
            include=_include(request),
            timeout=float(timeout) if timeout else None,
            clock=self._clock,
        )

    async def _create(self, request: Request, target: _Target, caller: Caller) -> Response:
        body = await self._read_object(request, target.spec)
        if target.spec.storage_key == (CRD_GROUP, "customresourcedefinitions"):
            check_crd_body(caller, body)
        validation = _field_validation(request)
        created = await self._store.create(
            target.spec.ref,
            body,
            namespace=target.namespace,
            dry_run=_dry_run(request),
            field_validation=validation,
        )
        response = self._object_response(request, target.spec, created, status=201)
        return _warn_unknown(response, target.spec, body, validation)

    async def _replace(self, request: Request, target: _Target) -> Response:
        body = await self._read_object(request, target.spec)
        name = (body.get("metadata") or {}).get("name") if isinstance(body.get("metadata"), dict) else None
        if name not in (None, "", target.name):
            raise BadRequest(f"the name of the object ({name}) does not match the name on the URL ({target.name})")
        body.setdefault("metadata", {})["name"] = target.name
        if not body["metadata"].get("resourceVersion") and target.spec.storage_key != ("", "namespaces"):
            # As kube-apiserver for every kind served here but Namespace (AllowUnconditionalUpdate is false).
            raise invalid_error(
                target.spec,
                target.item_name,
                [
                    Cause(
                        "FieldValueInvalid",
                        "Invalid value: 0: must be specified for an update",
                        "metadata.resourceVersion",
                    )
                ],
                by_resource=True,
            )
        validation = _field_validation(request)
        if target.subresource == "status":
            updated = await self._store.update_status(
                target.spec.ref, body, namespace=target.namespace, dry_run=_dry_run(request)
            )
        else:
            updated = await self._store.update(
                target.spec.ref,
                body,
                namespace=target.namespace,
                dry_run=_dry_run(request),
                field_validation=validation,
            )
        return _warn_unknown(self._object_response(request, target.spec, updated), target.spec, body, validation)

    async def _patch(self, request: Request, target: _Target) -> Response:
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        native = target.spec.storage_key in _NATIVE_KINDS
        accepted = [
            "application/json-patch+json",
            "application/merge-patch+json",
            *(["application/strategic-merge-patch+json"] if native else []),
            "application/apply-patch+yaml",
        ]
        patch_type = PATCH_CONTENT_TYPES.get(media_type)
        if patch_type is None or (patch_type == "strategic" and not native):
            # Custom resources have no Go types, so no strategic merge patch (kube-apiserver's 415 and wording).
            raise UnsupportedMediaType(
                f"the body of the request was in an unknown format - accepted media types include: "
                f"{', '.join(accepted)}"
            )
        raw = await self._read_body(request)
        patch = _decode(raw, yaml_allowed=patch_type == "apply")
        validation = _field_validation(request)
        warn_about: Mapping[str, Any] = patch if isinstance(patch, dict) else {}
        if validation == "Warn" and patch_type == "json":
            # Operations name no fields: warn about the unknown fields of the patched object, as kube-apiserver.
            current = await self._store.get(target.spec.ref, target.item_name, namespace=target.namespace)
            try:
                warn_about = apply_patch(current, patch, "json")
            except ResourceError:
                warn_about = {}  # the store reports the bad patch itself
        patched = await self._store.patch(
            target.spec.ref,
            target.item_name,
            patch,
            namespace=target.namespace,
            patch_type=patch_type,
            subresource=target.subresource,
            dry_run=_dry_run(request),
            field_validation=validation,
        )
        response = self._object_response(request, target.spec, patched)
        return _warn_unknown(response, target.spec, warn_about, validation)

    async def _delete(self, request: Request, target: _Target) -> Response:
        raw = await self._read_body(request)
        options: Mapping[str, Any] = {}
        if raw.strip():
            decoded = _decode(raw, yaml_allowed=False)
            if not isinstance(decoded, Mapping):
                raise BadRequest("DeleteOptions must be a JSON object")
            options = decoded
        query = request.query_params
        requested = query.get("propagationPolicy") or options.get("propagationPolicy") or "Background"
        policy: PropagationPolicy
        if requested == "Background":
            policy = "Background"
        elif requested == "Foreground":
            policy = "Foreground"
        elif requested == "Orphan":
            policy = "Orphan"
        else:
            raise BadRequest(f"unsupported propagationPolicy {requested!r}")
        if _flag(query.get("orphanDependents")) or options.get("orphanDependents") is True:
            policy = "Orphan"
        preconditions = options.get("preconditions") or {}
        if not isinstance(preconditions, Mapping):
            raise BadRequest("preconditions must be an object")
        dry_run = _dry_run(request) or options.get("dryRun") == ["All"]
        deleted = await self._store.delete(
            target.spec.ref,
            target.item_name,
            namespace=target.namespace,
            resource_version=preconditions.get("resourceVersion"),
            uid=preconditions.get("uid"),
            propagation_policy=policy,
            dry_run=dry_run,
        )
        meta = deleted.get("metadata") or {}
        if (meta.get("deletionTimestamp") and meta.get("finalizers")) or target.spec.storage_key == ("", "namespaces"):
            return self._object_response(request, target.spec, deleted)  # still there, or a Namespace (as k8s)
        # Removed: kube-apiserver answers a Status naming what was deleted (ReturnDeletedObject is off).
        details = {
            "name": target.item_name,
            "group": target.spec.group,
            "kind": target.spec.plural,
            "uid": str(meta.get("uid", "")),
        }
        if not details["group"]:
            del details["group"]
        return _JSON({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})

    # -- bodies ------------------------------------------------------------------------------------------------

    async def _read_body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self._max_body:
            raise RequestTooLarge(f"the request body is larger than {self._max_body} bytes")
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self._body_timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > self._max_body:
                        raise RequestTooLarge(f"the request body is larger than {self._max_body} bytes")
                    chunks.append(chunk)
        except TimeoutError as exc:
            raise BadRequest(f"timed out after {self._body_timeout}s reading the request body") from exc
        return b"".join(chunks)

    async def _read_object(self, request: Request, spec: KindSpec) -> dict[str, Any]:
        media_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if media_type not in ("application/json", "application/yaml", ""):
            raise UnsupportedMediaType(
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json, application/yaml"
            )
        # kube-apiserver's words for a body it cannot read as an object (the parser's own detail differs).
        unrecognized = f"the object provided is unrecognized (must be of type {spec.kind}): couldn't get version/kind"
        try:
            decoded = _decode(await self._read_body(request), yaml_allowed=media_type == "application/yaml")
        except BadRequest as exc:
            if "nests more than" in exc.message:
                raise
            raise BadRequest(f"{unrecognized}; json parse error: {exc.message}") from exc
        if not isinstance(decoded, dict):
            raise BadRequest(f"{unrecognized}; json parse error: the body is not a JSON object")
        return decoded


MAX_BODY_DEPTH = 100
"""How deeply a request body may nest objects and arrays; deeper is 400 before anything walks it recursively."""


def _decode(raw: bytes, *, yaml_allowed: bool) -> Any:
    try:
        value = _parse(raw, yaml_allowed=yaml_allowed)
    except RecursionError as exc:  # the parsers recurse per level: far deeper than any object
        raise BadRequest(f"the request body nests more than {MAX_BODY_DEPTH} levels deep") from exc
    if _nests_deeper(value, MAX_BODY_DEPTH):
        raise BadRequest(f"the request body nests more than {MAX_BODY_DEPTH} levels deep")
    return value


def _parse(raw: bytes, *, yaml_allowed: bool) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        if yaml_allowed:
            try:
                return yaml.safe_load(raw)
            except yaml.YAMLError as yaml_exc:
                raise BadRequest(f"the request body is not valid YAML: {yaml_exc}") from yaml_exc
        raise BadRequest(f"the request body is not valid JSON: {exc}") from exc


def _nests_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` nests dicts/lists more than ``limit`` levels (iterative: any depth, no recursion)."""
    if not isinstance(value, dict | list):
        return False
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        children = node.values() if isinstance(node, dict) else node
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


_NATIVE_KINDS = {
    ("", "namespaces"),
    ("coordination.k8s.io", "leases"),
    ("apiextensions.k8s.io", "customresourcedefinitions"),
}
"""Kinds kube-apiserver serves from Go types (strategic merge patch works); every other kind is a custom resource."""


def _warn_unknown(response: Response, spec: KindSpec, body: Mapping[str, Any], validation: FieldValidation) -> Response:
    """With ``fieldValidation=Warn`` (the default), one ``Warning`` header per unknown field the write dropped."""
    if validation == "Warn":
        for path in unknown_fields(spec, body):
            text = json.dumps(f'unknown field "{path}"', ensure_ascii=True)
            response.headers.append("Warning", f"299 - {text}")
    return response


def _flag(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1")


def _int(value: str | None, name: str) -> int | None:
    if value in (None, ""):
        return None
    try:
        number = int(value)
    except ValueError as exc:
        raise BadRequest(f"{name} must be an integer, got {value!r}") from exc
    if number < 0:
        raise BadRequest(f"{name} must not be negative")
    return number


def _dry_run(request: Request) -> bool:
    values = request.query_params.getlist("dryRun")
    for value in values:
        if value != "All":
            raise BadRequest(f"unsupported dryRun value {value!r}: only All is supported")
    return bool(values)


def _field_validation(request: Request) -> FieldValidation:
    value = request.query_params.get("fieldValidation") or "Warn"  # kube-apiserver's default
    if value not in ("Ignore", "Warn", "Strict"):
        raise BadRequest(f"fieldValidation must be Ignore, Warn or Strict, got {value!r}")
    return value  # type: ignore[return-value]


def _include(request: Request) -> IncludeObject:
    value = request.query_params.get("includeObject") or "Metadata"
    if value not in ("None", "Metadata", "Object"):
        raise BadRequest(f"includeObject must be None, Metadata or Object, got {value!r}")
    return value  # type: ignore[return-value]


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def create_api_app(
    store: ResourceStore,
    *,
    token: str | None,
    max_body_bytes: int = DEFAULT_MAX_BODY,
    resolve_token: TokenResolver | None = None,
    clock: Clock | None = None,
) -> ResourceApi:
    """The ASGI app loop-server mounts at ``/`` (it owns ``/version``, ``/api``, ``/apis``, ``/openapi``).

    ``token`` is the admin's; ``resolve_token`` maps any other bearer token to the responder it was issued to;
    ``clock`` dates the Age column of Table responses.
    """
    return ResourceApi(store, token=token, max_body_bytes=max_body_bytes, resolve_token=resolve_token, clock=clock)
