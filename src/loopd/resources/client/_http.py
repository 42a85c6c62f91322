"""The HTTP ``ResourceClient``: Kubernetes REST through ``kubernetes_asyncio``'s ``ApiClient``.

Owns: kubeconfig / in-cluster configuration loading, REST paths, JSON (de)serialization, watch-stream
decoding, and the translation of HTTP answers and transport failures into the resource error tree.
Must not do: retry, cache, or reconcile (that is the runtime's job); import ``kubernetes_asyncio`` anywhere
but here (it is the optional ``k8s`` extra).

``kubernetes_asyncio`` supplies what a real cluster needs and nobody should rewrite: kubeconfig parsing
(contexts, client certificates, CA data, tokens, exec and OIDC auth plugins with refresh), in-cluster
service-account configuration, TLS, and a pooled aiohttp transport. Requests go through ``ApiClient.call_api``
with raw JSON rather than the generated typed models, so one code path serves every kind, CRDs included, and
watch semantics (bookmarks, ``410 Gone``) stay explicit instead of being retried away by ``watch.Watch``.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
import yaml
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from loopd.resources import BadRequest, ObjectList, WatchEvent

from ._errors import TransportError, error_from_response
from ._types import JsonObject, PatchType, ResourceType, name_of, namespace_of

_PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
}
_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_WATCH_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})


class HttpResourceClient:
    """A ``ResourceClient`` speaking the Kubernetes REST API over an ``ApiClient``.

    ``request_timeout`` bounds every unary call end to end; a watch is bounded by its ``timeout_seconds`` (plus
    ``request_timeout`` of slack) and by ``watch_idle_timeout`` between two reads.
    """

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        *,
        default_namespace: str = "default",
        request_timeout: float = 30.0,
        watch_idle_timeout: float = 330.0,
        page_size: int = 500,
    ) -> None:
        self._api = api_client
        self._default_namespace = default_namespace
        self._request_timeout = request_timeout
        self._watch_idle_timeout = watch_idle_timeout
        self._page_size = page_size

    @property
    def default_namespace(self) -> str:
        return self._default_namespace

    # -- reads -----------------------------------------------------------------------------------------------

    async def get(self, resource: ResourceType, name: str, *, namespace: str | None = None) -> JsonObject:
        return await self._call_object("GET", self._path(resource, self._ns(resource, namespace), name))

    async def list(
        self, resource: ResourceType, *, namespace: str | None = None, label_selector: str | None = None
    ) -> ObjectList:
        path = self._path(resource, namespace if resource.namespaced else None)
        items: list[JsonObject] = []
        resource_version = ""
        token: str | None = None
        while True:
            query: dict[str, str] = {"limit": str(self._page_size)}
            if label_selector:
                query["labelSelector"] = label_selector
            if token:
                query["continue"] = token
            page = await self._call_object("GET", path, query=query)
            for item in page.get("items") or []:
                # List items omit apiVersion/kind on the wire; restore them so items look like single reads.
                item.setdefault("apiVersion", resource.api_version)
                item.setdefault("kind", resource.kind)
                items.append(item)
            meta = page.get("metadata") or {}
            resource_version = resource_version or str(meta.get("resourceVersion") or "")
            token = meta.get("continue") or None
            if not token:
                return ObjectList(items=items, resource_version=resource_version, continue_token=None)

    # -- writes ----------------------------------------------------------------------------------------------

    async def create(
        self, resource: ResourceType, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObject:
        body = self._body(resource, obj)
        ns = self._ns(resource, namespace or namespace_of(body))
        if ns and namespace and namespace_of(body) and namespace_of(body) != namespace:
            raise BadRequest("the namespace of the provided object does not match the namespace of the request")
        return await self._call_object("POST", self._path(resource, ns), body=body)

    async def update(self, resource: ResourceType, obj: Mapping[str, Any]) -> JsonObject:
        body = self._body(resource, obj)
        path = self._path(resource, self._ns(resource, namespace_of(body)), self._name(body))
        return await self._call_object("PUT", path, body=body)

    async def update_status(self, resource: ResourceType, obj: Mapping[str, Any]) -> JsonObject:
        body = self._body(resource, obj)
        path = self._path(resource, self._ns(resource, namespace_of(body)), self._name(body), "status")
        return await self._call_object("PUT", path, body=body)

    async def patch(
        self,
        resource: ResourceType,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
        subresource: Literal["status"] | None = None,
    ) -> JsonObject:
        content_type = _PATCH_CONTENT_TYPES.get(patch_type)
        if content_type is None:
            raise BadRequest(f"unsupported patch type {patch_type!r}")
        path = self._path(resource, self._ns(resource, namespace), name, subresource)
        return await self._call_object("PATCH", path, body=patch, content_type=content_type)

    async def delete(
        self,
        resource: ResourceType,
        name: str,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        options: JsonObject = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if resource_version is not None:
            options["preconditions"] = {"resourceVersion": resource_version}
        await self._call("DELETE", self._path(resource, self._ns(resource, namespace), name), body=options)

    async def aclose(self) -> None:
        await self._api.close()

    # -- watch -----------------------------------------------------------------------------------------------

    def open_watch(
        self,
        resource: ResourceType,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
        label_selector: str | None = None,
        allow_bookmarks: bool = True,
        timeout_seconds: float | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        return self._watch(resource, namespace, resource_version, label_selector, allow_bookmarks, timeout_seconds)

    @asynccontextmanager
    async def _watch(
        self,
        resource: ResourceType,
        namespace: str | None,
        resource_version: str | None,
        label_selector: str | None,
        allow_bookmarks: bool,
        timeout_seconds: float | None,
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        query: dict[str, str] = {"watch": "true"}
        if resource_version:
            query["resourceVersion"] = resource_version
        if allow_bookmarks:
            query["allowWatchBookmarks"] = "true"
        if label_selector:
            query["labelSelector"] = label_selector
        total: float | None = None
        if timeout_seconds is not None:
            query["timeoutSeconds"] = str(max(1, int(timeout_seconds)))
            total = timeout_seconds + self._request_timeout
        timeout = aiohttp.ClientTimeout(total=total, connect=self._request_timeout, sock_read=self._watch_idle_timeout)
        path = self._path(resource, namespace if resource.namespaced else None)
        response = await self._send("GET", path, query=query, timeout=timeout)
        try:
            if response.status >= 400:
                raise await self._error(response)
            yield _HttpWatchStream(response, f"GET {path}")
        finally:
            _discard(response)

    # -- plumbing --------------------------------------------------------------------------------------------

    async def _call_object(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> JsonObject:
        result = await self._call(method, path, query=query, body=body, content_type=content_type)
        if not isinstance(result, dict):
            raise TransportError(f"{method} {path}: the server answered with something other than an object")
        return result

    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        timeout = aiohttp.ClientTimeout(total=self._request_timeout)
        response = await self._send(method, path, query=query, body=body, content_type=content_type, timeout=timeout)
        try:
            if response.status >= 400:
                error = await self._error(response)
            else:
                data = await self._read(response, f"{method} {path}")
        except BaseException:  # the body was not read to its end (cancelled, or the connection broke)
            _discard(response)
            raise
        response.release()
        if response.status >= 400:
            raise error
        return _decode(data)

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        try:
            response: aiohttp.ClientResponse = await self._api.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise TransportError(f"{method} {path}: {exc or type(exc).__name__}") from exc
        return response

    async def _error(self, response: aiohttp.ClientResponse) -> Exception:
        data = await self._read(response, f"{response.method} {response.url.path}")
        retry_after: float | None = None
        try:
            retry_after = float(response.headers.get("Retry-After", ""))
        except ValueError:
            retry_after = None
        try:
            body: Any = _decode(data)
        except TransportError:
            body = data.decode("utf-8", "replace")
        return error_from_response(response.status, body, retry_after=retry_after)

    @staticmethod
    async def _read(response: aiohttp.ClientResponse, what: str) -> bytes:
        try:
            return await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise TransportError(f"{what}: {exc or type(exc).__name__}") from exc

    def _ns(self, resource: ResourceType, namespace: str | None) -> str | None:
        if not resource.namespaced:
            return None
        return namespace or self._default_namespace

    @staticmethod
    def _name(body: Mapping[str, Any]) -> str:
        name = name_of(body)
        if not name:
            raise BadRequest("metadata.name is required")
        return name

    @staticmethod
    def _body(resource: ResourceType, obj: Mapping[str, Any]) -> JsonObject:
        body = dict(obj)
        body.setdefault("apiVersion", resource.api_version)
        body.setdefault("kind", resource.kind)
        return body

    @staticmethod
    def _path(
        resource: ResourceType, namespace: str | None, name: str | None = None, subresource: str | None = None
    ) -> str:
        path = f"/apis/{resource.group}/{resource.version}" if resource.group else f"/api/{resource.version}"
        if namespace:
            path += f"/namespaces/{quote(namespace, safe='')}"
        path += f"/{resource.plural}"
        if name is not None:
            path += f"/{quote(name, safe='')}"
            if subresource is not None:
                path += f"/{subresource}"
        return path


def _discard(response: aiohttp.ClientResponse) -> None:
    """Let go of a response whose body may be unread: its connection is aborted, not shut down politely.

    A polite TLS shutdown is a handshake nobody waits for; when the event loop ends first (a cancelled watch
    at shutdown), the socket under it is left open and Python warns about it. The connection could not be
    reused anyway.
    """
    connection = response.connection
    if connection is not None and connection.protocol is not None:
        connection.protocol.abort()
    response.close()


class _HttpWatchStream:
    """Decodes one ``?watch=true`` response: a JSON object per line."""

    def __init__(self, response: aiohttp.ClientResponse, what: str) -> None:
        self._response = response
        self._what = what

    def __aiter__(self) -> _HttpWatchStream:
        return self

    async def __anext__(self) -> WatchEvent:
        while True:
            try:
                line = await self._response.content.readline()
            except TimeoutError:
                # Nothing arrived for watch_idle_timeout (or the overall bound passed): end the stream; the
                # caller resumes from the last version it saw.
                raise StopAsyncIteration from None
            except (aiohttp.ClientError, OSError) as exc:
                raise TransportError(f"{self._what}: {exc or type(exc).__name__}") from exc
            if not line:
                raise StopAsyncIteration
            if line.strip():
                return _watch_event(_decode(line))


def _watch_event(frame: Any) -> WatchEvent:
    if not isinstance(frame, dict) or not isinstance(frame.get("object"), dict):
        raise TransportError(f"malformed watch event: {str(frame)[:200]}")
    event_type = frame.get("type")
    obj: JsonObject = frame["object"]
    if event_type == "ERROR":
        code = obj.get("code")
        raise error_from_response(code if isinstance(code, int) else 500, obj)
    if event_type not in _WATCH_TYPES:
        raise TransportError(f"unknown watch event type {event_type!r}")
    return WatchEvent(event_type, obj)


def _decode(data: bytes) -> Any:
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError as exc:
        raise TransportError(f"the server sent malformed JSON: {data[:200]!r}") from exc


@asynccontextmanager
async def open_http_client(
    kubeconfig: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    *,
    context: str | None = None,
    request_timeout: float = 30.0,
) -> AsyncIterator[HttpResourceClient]:
    """Open an HTTP client configured like ``kubectl``.

    ``kubeconfig`` is a path or an already-parsed kubeconfig; without it: ``$KUBECONFIG`` or
    ``~/.kube/config`` when present, else the in-cluster service account. The default namespace is the
    context's namespace (or the service account's), else ``"default"``.
    """
    configuration = type.__call__(k8s_client.Configuration)  # a fresh configuration, not the global default
    namespace: str | None
    if isinstance(kubeconfig, Mapping):
        await k8s_config.load_kube_config_from_dict(
            dict(kubeconfig), context=context, client_configuration=configuration
        )
        namespace = _context_namespace(kubeconfig, context)
    else:
        path = _kubeconfig_path(kubeconfig)
        if path is None:
            load_incluster: Any = k8s_config.load_incluster_config  # untyped in kubernetes_asyncio
            load_incluster(client_configuration=configuration)
            namespace = _in_cluster_namespace()
        else:
            await k8s_config.load_kube_config(
                config_file=str(path), context=context, client_configuration=configuration, persist_config=False
            )
            namespace = _context_namespace(_read_yaml(path), context)
    api_client = k8s_client.ApiClient(configuration=configuration)
    client = HttpResourceClient(api_client, default_namespace=namespace or "default", request_timeout=request_timeout)
    try:
        yield client
    finally:
        await client.aclose()


def _kubeconfig_path(kubeconfig: str | os.PathLike[str] | None) -> Path | None:
    if kubeconfig is not None:
        return Path(kubeconfig)
    from_env = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    if from_env:
        return Path(from_env).expanduser()
    home = Path("~/.kube/config").expanduser()
    if home.exists() or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return home
    return None


def _in_cluster_namespace() -> str | None:
    try:
        return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
    except OSError:
        return None


def _read_yaml(path: Path) -> Mapping[str, Any]:
    loaded = yaml.safe_load(path.read_text())
    return loaded if isinstance(loaded, Mapping) else {}


def _context_namespace(kubeconfig: Mapping[str, Any], context: str | None) -> str | None:
    wanted = context or kubeconfig.get("current-context")
    for entry in kubeconfig.get("contexts") or []:
        if isinstance(entry, Mapping) and entry.get("name") == wanted:
            details = entry.get("context") or {}
            namespace = details.get("namespace") if isinstance(details, Mapping) else None
            return str(namespace) if namespace else None
    return None
