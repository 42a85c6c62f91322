"""The composition root of one loop-server process (`loopd up`, `loopd server`): everything wired, started and
stopped in order. `loopd up` adds the operators beside it (loopd.cli); `loopd server` runs it alone.

    data dir ─┬─ loopd.lock          exclusive: one embedded server per data directory
              ├─ loopd.db            conversations, messages, event logs, human requests, harness calls, ledger
              ├─ resources.db        the Kubernetes-compatible store (Tasks, Leases); in PostgreSQL with --database
              ├─ resources-api/      CA, server certificate, the token (0600), the API endpoint
              ├─ harness/journal.db  the built-in harness's journal
              └─ server.json         where this server listens (read by `loopd chat`)

    <data dir>-workspaces/assistant   the built-in `assistant` harness's workspace (`--workspaces` moves it)
    <data dir>-workspaces/<kind>/<key>/<id>   a harness call's own workspace (``workspace``: an operator's Run)

Workspaces live outside the data directory, which holds the credentials: a command in a workspace must not
reach them through ``..``. The rig's bash runs in the sandbox of `UpSettings.sandbox`, which also hides the
data directory should it lie inside a workspace. A workspace found at the old place, ``<data dir>/workspaces``,
is moved to the new one at start when the new one does not exist yet.

Where Tasks live (`UpSettings.kube_api`): ``embedded`` — loopd's own store (SQLite in the data directory, or
PostgreSQL beside the server state when the database is PostgreSQL, so replicas share Tasks) served as a
Kubernetes-compatible API; ``kubeconfig`` / ``in-cluster`` — a real Kubernetes API server (the CRDs installed
beforehand), reached with the HTTP resource client; no embedded API is served then.

Harness targets (`UpSettings.harnesses`, from the configuration file): built-in rigs in this process, remote
`loopd harness serve` peers, plain OpenAI-compatible models; without any, the built-in ``assistant``.

Start order: lock → credentials → resource store (embedded) → database → the store's TLS API (it resolves responder
tokens through the database) or the remote Kubernetes client → harness targets → engine → responder (reconcile
manager on Tasks) → HTTP API. Stop order is the reverse, so nothing is used after it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

from loopd._infra.clock import Clock, SystemClock
from loopd._infra.http import is_loopback
from loopd._infra.ids import new_id
from loopd._infra.locking import data_dir_lock
from loopd._infra.metrics import GaugeSample, Metrics
from loopd._infra.notify import open_notifier
from loopd._infra.tasks import TaskSet
from loopd._paths import SERVER_FILE, write_server_file
from loopd.harness import Model, Reply, ScriptedModel
from loopd.harness.actors import Rig
from loopd.harness.foreign import standard_engine
from loopd.harness.gate import DEFAULT_POLICY
from loopd.harness.models import DemoRule, ModelConfig, open_model
from loopd.harness.standard import (
    DEFAULT_SYSTEM_PROMPT,
    STANDARD_MODES,
    HarnessSettings,
    open_standard_rig,
    workspace_rigs,
)
from loopd.harness.tools import ASK_TIMEOUT_DEFAULT, Sandbox, resolve_sandbox
from loopd.resources import NotFound as ResourceNotFound
from loopd.resources import (
    ResourceStore,
    StoreOptions,
    TokenResolver,
    load_or_create_credentials,
    open_api_server,
    open_sqlite_store,
    write_endpoint,
)
from loopd.resources.client import TASKS, ResourceClient, StoreClient, open_http_client, tasks_not_for
from loopd.resources.reconcile import Manager
from loopd.server._errors import ServerSetupError
from loopd.server.app import Readiness, ServerContext, create_server_app
from loopd.server.audit import ledger_router
from loopd.server.chat import (
    ChatRequests,
    ConversationForks,
    ConversationReader,
    ConversationTitles,
    OpenAnswers,
    ResourceTaskGateway,
    TaskApi,
    demo_title_reply,
)
from loopd.server.config import (
    BuiltinHarness,
    ForeignHarness,
    HarnessTarget,
    MissingSecret,
    ModelHarness,
    RemoteHarness,
)
from loopd.server.engine import (
    DEFAULT_TIMEOUT,
    BuiltinHarnessAdapter,
    HarnessAdapter,
    HarnessEngine,
    OpenAIModelAdapter,
    PromptRecording,
    RemoteHarnessAdapter,
    engine_router,
    recording_rig,
)
from loopd.server.http import AccessStore, Identity, ServerSecurity, open_http_server
from loopd.server.human import HumanService
from loopd.server.ledger import ArtifactRetention, Redactor, SqlLedgerStore
from loopd.server.registry import ActorInfo, RegistryService
from loopd.server.responder import HarnessResponder
from loopd.server.storage import Database, DatabaseOptions, InvalidRecord, StorageError, open_database
from loopd.server.streams import ConversationBus

DEFAULT_PORT: Final = 8420
LOCK_FILE: Final = "loopd.lock"
ASSISTANT: Final = "assistant"
ASSISTANT_DESCRIPTION: Final = "The built-in harness: file and bash tools in its own workspace, with permission gates."


KubeApiMode = Literal["embedded", "kubeconfig", "in-cluster"]
SERVICE_ACCOUNT_TOKEN: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
"""Where a pod's ServiceAccount token is mounted (with ``ca.crt`` and ``namespace`` beside it)."""


@dataclass(frozen=True)
class UpSettings:
    """Everything one loop-server process is built from (`loopd up` and `loopd server` fill it from their flags,
    the configuration file and the environment)."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_port: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    """The model of built-in harnesses that name none (the default ``assistant``'s)."""
    database_url: str | None = None
    """PostgreSQL DSN for the server state (default: SQLite in the data directory)."""
    lease_ttl: float = 30.0
    engine_capacity: int = 200
    """Harness calls at once (`CallSlots`): cheap while a call waits for its model; a chat beyond them waits for a
    whole answer of another before it starts."""
    public: bool = False
    """Allow a non-loopback ``host`` (`check_exposure`): the operator's explicit opt-in to serve the network."""
    workspaces: Path | None = None
    """Where harness workspaces live; must be outside ``data_dir`` (default: `default_workspaces`)."""
    sandbox: Sandbox | None = None
    """Where the built-in harness's bash runs commands (default: `resolve_sandbox()`)."""
    demo_rules: tuple[DemoRule, ...] = ()
    """Extra reply rules for the demo model, tried before its own (the CLI passes the Router's `demo_rules()`)."""
    announce: bool = True
    """Write ``server.json`` as soon as the server listens. False: the caller does, with `RunningServer.announce`,
    once what it runs beside the server is ready (`loopd up` waits for its Router to register, so a client that
    finds the server never asks ``operator:router`` before it is known)."""
    harnesses: tuple[HarnessTarget, ...] | None = None
    """The harness targets (the configuration file's ``harnesses``); None: the built-in ``assistant`` only."""
    kube_api: KubeApiMode = "embedded"
    """Where Tasks live: the embedded store and API, a kubeconfig's cluster, or the pod's own cluster."""
    kubeconfig: Path | None = None
    """With ``kube_api="kubeconfig"``: the kubeconfig file."""
    namespace: str = "default"
    """The namespace of the Tasks this server creates and answers (on a real cluster: the only one it watches)."""
    kube_timeout: float = 10.0
    """Seconds one Kubernetes API request may take."""
    task_workers: int = 8
    """Tasks the responder reconciles at once."""
    call_timeout: float = DEFAULT_TIMEOUT
    """Seconds one Task's harness call may run."""
    admin_tokens: tuple[str, ...] = ()
    """Bearer tokens accepted as the admin besides the generated one (e.g. one shared by every replica)."""
    actor_tokens: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """``(actor, token)`` pairs made elsewhere (``operator:router``, a Secret's token) that this server accepts as
    those actors' tokens (`AccessStore.adopt_token`, at start)."""
    holder: str = "loopd up"
    """Who holds the data directory's lock (named when a second process is refused)."""
    ledger_prompts: bool = True
    """Store every model call's full request and reply in the ledger (built-in harnesses), redacted."""
    ledger_retention: float | None = None
    """Seconds the ledger keeps prompts and replies after their trail's last event (None: for good)."""
    ledger_redact: tuple[str, ...] = ()
    """Extra regular expressions redacted from what the ledger stores (besides keys, tokens and passwords)."""


class WorkspaceLocationError(ServerSetupError):
    """The workspaces directory lies inside the data directory, next to the credentials."""


def default_workspaces(data_dir: Path) -> Path:
    """``<data dir>-workspaces``, a sibling of the data directory (outside it, so ``..`` cannot reach it)."""
    return data_dir.parent / f"{data_dir.name}-workspaces"


def workspaces_root(data_dir: Path, workspaces: Path | None) -> Path:
    """The resolved workspaces directory; `WorkspaceLocationError` when it is the data directory or inside it."""
    root = (workspaces if workspaces is not None else default_workspaces(data_dir)).expanduser().resolve()
    if root.is_relative_to(data_dir):
        raise WorkspaceLocationError(
            f"the workspaces directory {root} is inside the data directory {data_dir}, which holds the credentials"
        )
    return root


def _move_old_workspace(data_dir: Path, workspace: Path) -> None:
    old = data_dir / "workspaces" / ASSISTANT
    if old.is_dir() and not old.is_symlink() and not os.path.lexists(workspace):
        workspace.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # another filesystem: the old one stays, the new one starts empty
            os.rename(old, workspace)
            with contextlib.suppress(OSError):
                (data_dir / "workspaces").rmdir()


class ExposureRefused(ServerSetupError):
    """A non-loopback address to listen on, without the explicit opt-in (``--public``)."""


def check_exposure(host: str, *, public: bool) -> None:
    """Refuse to listen on anything but loopback unless ``public``: `ExposureRefused`, with a one-line reason.

    Both of `loopd up`'s ports (the HTTP API and the Kubernetes-compatible API) listen on ``host``. Exposed, every
    caller needs a credential: the admin token (generated, 256 bits, 0600 in the data directory), an actor token,
    or a cookie from a one-time sign-in link; browsers are never trusted for their ``Host`` header.
    """
    if is_loopback(host) or public:
        return
    raise ExposureRefused(
        f"refusing to listen on {host}: that exposes loopd (HTTP API and Kubernetes API) beyond this machine; "
        "pass --public to do it on purpose (callers then need a token or a sign-in link), or use --host 127.0.0.1"
    )


@dataclass(frozen=True)
class RunningServer:
    """A running loop-server: where it listens and the services a command composes with (`loopd up`'s operators)."""

    url: str
    api_url: str | None
    """The embedded Kubernetes-compatible API (None: Tasks live on a real cluster)."""
    data_dir: Path
    token_file: Path
    model: ModelConfig
    db: Database
    conversations: ConversationReader
    chat: ChatRequests
    engine: HarnessEngine
    workspace: Path
    """The first built-in harness's workspace (the ``assistant``'s by default)."""
    sandbox: Sandbox
    server_file_info: dict[str, Any] = field(default_factory=dict, repr=False)
    kube_api: KubeApiMode = "embedded"
    harnesses: tuple[ActorInfo, ...] = ()
    """The harness targets this server answers with (as `/v1/actors` lists them)."""
    metrics: Metrics | None = None
    """This server's Prometheus registry (``/metrics``); `loopd up`'s operators report into it too."""
    app: Any = field(default=None, repr=False)
    """The ASGI app the HTTP server serves: `loopd up`'s operators send their requests through it in process
    (`loopd._infra.inprocess`), with the same routes, credentials and middleware as over the socket."""

    def announce(self) -> None:
        """Write ``server.json`` (where clients such as `loopd chat` find this server). Idempotent; removed when
        the server stops."""
        write_server_file(self.data_dir, self.server_file_info)


async def _adopt_tokens(db: Database, tokens: tuple[tuple[str, str], ...]) -> None:
    access = AccessStore(db)
    for actor, token in tokens:
        kind, _, key = actor.partition(":")
        if kind == "operator":
            identity = Identity("operator", key)
        elif kind == "harness":
            identity = Identity("harness", key)
        else:
            raise ServerSetupError(f"auth.actor_tokens: {actor!r} is not operator:<key> or harness:<key>")
        try:
            await access.adopt_token(identity, token)
        except InvalidRecord as exc:
            raise ServerSetupError(f"auth.actor_tokens: {exc.message}") from exc


def _responder_of(access: AccessStore) -> TokenResolver:
    """The Kubernetes-compatible API's view of loop-server's actor tokens: a token → ``operator:<key>`` / ...."""

    async def resolve(token: str) -> str | None:
        try:
            actor = await access.token_actor(token)
        except StorageError:
            return None  # refused (401) rather than a 500; the HTTP API reports the storage failure itself
        return None if actor is None else actor.text

    return resolve


def resolve_kube_api(requested: str, kubeconfig: Path | None, env: Mapping[str, str] | None = None) -> KubeApiMode:
    """The Kubernetes API a server uses for ``requested`` (``auto`` | ``embedded`` | ``in-cluster`` |
    ``kubeconfig``): ``auto`` is ``kubeconfig`` when one is given, else ``in-cluster`` inside a pod (the
    ``KUBERNETES_SERVICE_HOST`` variable and a mounted ServiceAccount token), else ``embedded``.
    `ServerSetupError` for ``kubeconfig`` without a file, or ``in-cluster`` outside a pod."""
    source = os.environ if env is None else env
    in_pod = bool(source.get("KUBERNETES_SERVICE_HOST")) and SERVICE_ACCOUNT_TOKEN.is_file()
    if requested == "auto":
        return "kubeconfig" if kubeconfig is not None else ("in-cluster" if in_pod else "embedded")
    if requested == "kubeconfig":
        if kubeconfig is None:
            raise ServerSetupError("kubernetes.api is kubeconfig but no kubeconfig file is given (--kubeconfig FILE)")
        return "kubeconfig"
    if requested == "in-cluster":
        if not in_pod:
            raise ServerSetupError(
                "kubernetes.api is in-cluster but this is not a pod: KUBERNETES_SERVICE_HOST is unset or "
                f"{SERVICE_ACCOUNT_TOKEN} is missing"
            )
        return "in-cluster"
    if requested == "embedded":
        return "embedded"
    raise ServerSetupError(f"unknown Kubernetes API {requested!r}: auto, embedded, in-cluster or kubeconfig")


def resolve_namespace(namespace: str | None, mode: KubeApiMode) -> str:
    """The namespace of the Tasks: ``namespace`` when given, else the pod's own (its ServiceAccount's) in-cluster,
    else ``default``."""
    if namespace:
        return namespace
    if mode == "in-cluster":
        try:
            own = (SERVICE_ACCOUNT_TOKEN.parent / "namespace").read_text().strip()
        except OSError:
            own = ""
        if own:
            return own
    return "default"


@dataclass(frozen=True)
class _Targets:
    adapters: dict[str, HarnessAdapter]
    actors: tuple[ActorInfo, ...]
    workspace: Path


def _default_targets() -> tuple[HarnessTarget, ...]:
    return (BuiltinHarness(key=ASSISTANT, title="Assistant", description=ASSISTANT_DESCRIPTION),)


async def _open_targets(
    stack: AsyncExitStack,
    settings: UpSettings,
    data_dir: Path,
    root: Path,
    sandbox: Sandbox,
    clock: Clock,
    metrics: Metrics,
) -> _Targets:
    """Every harness target of ``settings`` opened on ``stack``: its engine adapter and how `/v1/actors` shows it."""
    targets = settings.harnesses if settings.harnesses is not None else _default_targets()
    adapters: dict[str, HarnessAdapter] = {}
    actors: list[ActorInfo] = []
    first_workspace: Path | None = None
    try:
        for target in targets:
            adapter: HarnessAdapter
            if isinstance(target, BuiltinHarness):
                adapter, workspace = await _open_builtin(
                    stack, target, settings, data_dir, root, sandbox, clock, metrics
                )
                first_workspace = first_workspace or workspace
            elif isinstance(target, RemoteHarness):
                # The peer's model calls arrive redacted by it; the ledger redacts them again with this server's rules.
                recorded = PromptRecording(clock, ledger_redactor(settings)) if settings.ledger_prompts else None
                remote = RemoteHarnessAdapter(
                    target.url, target.token(), timeout=target.timeout or 10.0, clock=clock, prompts=recorded
                )
                stack.push_async_callback(remote.aclose)
                adapter = remote
            elif isinstance(target, ForeignHarness):
                adapter = await _open_foreign(stack, target, settings, data_dir, root, clock, metrics)
            else:
                adapter = await _open_model_target(stack, target, settings, clock)
            adapters[target.key] = adapter
            builtin = isinstance(target, BuiltinHarness)  # the standard rig's modes; a conversation may pick one
            actors.append(
                ActorInfo(
                    "harness",
                    target.key,
                    target.title or target.key,
                    target.description or _described(target),
                    modes=tuple(m.name for m in STANDARD_MODES) if builtin else (),
                    mode=(target.mode or "build") if isinstance(target, BuiltinHarness) else None,
                )
            )
    except MissingSecret as exc:
        raise ServerSetupError(str(exc)) from exc
    return _Targets(adapters, tuple(actors), first_workspace or root / ASSISTANT)


def _described(target: HarnessTarget) -> str:
    if isinstance(target, BuiltinHarness):
        return ASSISTANT_DESCRIPTION
    if isinstance(target, RemoteHarness):
        return f"A remote harness at {target.url}."
    if isinstance(target, ForeignHarness):
        return f"The {target.engine} coding agent in its own workspace (its tool requests ask you first)."
    return f"The model {target.model.name}: one answer per question, no tools."


async def _open_builtin(
    stack: AsyncExitStack,
    target: BuiltinHarness,
    settings: UpSettings,
    data_dir: Path,
    root: Path,
    sandbox: Sandbox,
    clock: Clock,
    metrics: Metrics,
) -> tuple[BuiltinHarnessAdapter, Path]:
    workspace = (target.workspace or root / target.key).expanduser().resolve()
    if workspace.is_relative_to(data_dir):
        raise WorkspaceLocationError(
            f"the workspace {workspace} of harness {target.key} is inside the data directory {data_dir}, which "
            "holds the credentials"
        )
    if target.key == ASSISTANT and target.workspace is None:
        _move_old_workspace(data_dir, workspace)
    harness_settings = HarnessSettings(
        workspace=workspace,
        # The assistant's journal stays where it always was; any other built-in harness has its own.
        data_dir=data_dir / ("harness" if target.key == ASSISTANT else f"harness-{target.key}"),
        model=target.model.resolve() if target.model is not None else settings.model,
        policy=target.policy or DEFAULT_POLICY,
        system_prompt=target.system_prompt or DEFAULT_SYSTEM_PROMPT,
        max_steps=target.max_steps or 50,
        mode=target.mode,
        snapshots=target.snapshots,  # a retry / edit fork restores the workspace the retried turn found
        compact_at_tokens=target.compact_at_tokens or HarnessSettings.compact_at_tokens,
        mcp_servers=target.mcp_servers,  # a server that cannot start is one warning line in the log
        journal_dsn=settings.database_url,  # with PostgreSQL, any replica can resume a call
        sandbox=sandbox,
        hidden=(data_dir,),
        demo_rules=settings.demo_rules,
        ask_user_timeout=ASK_TIMEOUT_DEFAULT,  # a question becomes an ask block that the asking user answers
    )
    rig = await stack.enter_async_context(open_standard_rig(harness_settings, clock=clock))
    rig = replace(rig, on_journal_commit=metrics.journal_commit_seconds.observe)
    if target.tools is not None:
        rig = _with_tools(rig, frozenset(target.tools))
    prompts: PromptRecording | None = None
    if settings.ledger_prompts:  # each session's model calls report to the engine, which stores them redacted
        rig = recording_rig(rig)
        prompts = PromptRecording(clock, ledger_redactor(settings, harness_settings.model))
    # Calls that name their own workspace (an operator's Executor / Auditor) work under the same root,
    # in <root>/<caller kind>/<caller key>/<id>, beside the harnesses' own <root>/<key>.
    call_workspaces = workspace_rigs(rig, harness_settings, root)
    adapter = BuiltinHarnessAdapter(
        rig, workspaces=call_workspaces, prompts=prompts, continues=target.continue_conversations
    )
    return adapter, workspace


async def _open_foreign(
    stack: AsyncExitStack,
    target: ForeignHarness,
    settings: UpSettings,
    data_dir: Path,
    root: Path,
    clock: Clock,
    metrics: Metrics,
) -> BuiltinHarnessAdapter:
    """A foreign loop (`loopd.harness.foreign`) behind the built-in adapter: the standard rig whose main loop hands
    each turn to ``target.engine``'s CLI in the target's workspace, its journal beside the built-in harnesses'.
    Calls cannot name their own workspace (the CLI works in its one) nor start as forks; the CLI's permission
    requests meet the target's gate policy, and what it leaves open becomes a gate the asker answers."""
    workspace = (target.workspace or root / target.key).expanduser().resolve()
    if workspace.is_relative_to(data_dir):
        raise WorkspaceLocationError(
            f"the workspace {workspace} of harness {target.key} is inside the data directory {data_dir}, which "
            "holds the credentials"
        )
    harness_settings = HarnessSettings(
        workspace=workspace,
        data_dir=data_dir / f"harness-{target.key}",
        policy=target.policy or DEFAULT_POLICY,
        journal_dsn=settings.database_url,  # with PostgreSQL, any replica can resume a call
        hidden=(data_dir,),
        foreign=standard_engine(target.engine, target.command, workspace),
        model=ModelConfig(prices_path=settings.model.prices_path),  # prices the tokens a CLI reports (codex)
    )
    rig = await stack.enter_async_context(open_standard_rig(harness_settings, clock=clock))
    rig = replace(rig, on_journal_commit=metrics.journal_commit_seconds.observe)
    # No forks: a forked session would resume the same CLI session (kept by the CLI, not the journal) as its source.
    return BuiltinHarnessAdapter(rig, forks=False)


def ledger_redactor(settings: UpSettings, *models: ModelConfig) -> Redactor:
    """What the ledger redacts: the built-in secrets' shapes, ``settings.ledger_redact`` and the literal keys this
    server knows (its models' API keys, its admin tokens)."""
    literals = [*settings.admin_tokens]
    for model in (settings.model, *models):
        for name in ("api_key", "anthropic_api_key"):
            key = getattr(model, name, None)
            if key is not None:
                literals.append(key.get_secret_value())
    return Redactor(settings.ledger_redact, literals=literals)


def _with_tools(rig: Rig, names: frozenset[str]) -> Rig:
    """``rig`` whose loops and agents offer only the tools named in ``names``."""

    def keep(definition: Any) -> Any:
        kept = (t for t in definition.tools if t.spec.name in names or t.spec.name.startswith("mcp__"))  # MCP: its own
        return replace(definition, tools=tuple(kept))

    return replace(rig, loops=[keep(loop) for loop in rig.loops], agents=[keep(agent) for agent in rig.agents])


async def _open_model_target(
    stack: AsyncExitStack, target: ModelHarness, settings: UpSettings, clock: Clock
) -> OpenAIModelAdapter:
    config = target.model.resolve()
    model = await stack.enter_async_context(open_model(config))
    prompts = PromptRecording(clock, ledger_redactor(settings, config)) if settings.ledger_prompts else None
    return OpenAIModelAdapter(
        model,
        model_name=config.model,
        system_prompt=target.system_prompt,
        max_output_tokens=target.max_output_tokens,
        prompts=prompts,
    )


async def _probe_tasks(client: ResourceClient, namespace: str) -> None:
    try:
        await client.get(TASKS, "loopd-readiness-probe", namespace=namespace)
    except ResourceNotFound:
        return  # the API answered


def _readiness(client: ResourceClient, namespace: str, timeout: float) -> Readiness:
    """``/readyz``'s check besides the database's: the Kubernetes API of the Tasks answers within ``timeout``."""

    async def ready() -> dict[str, str | None]:
        try:
            async with asyncio.timeout(timeout):
                await _probe_tasks(client, namespace)
        except TimeoutError:
            return {"kubernetes": f"the Kubernetes API did not answer within {timeout:g} s"}
        except Exception as exc:
            # /readyz is public: the reason (addresses, API messages) goes to the log, not to the caller.
            logging.getLogger("loopd.server").warning(
                "not ready: the Kubernetes API fails: %s: %s", type(exc).__name__, exc
            )
            return {"kubernetes": "the Kubernetes API fails (the reason is in the server's log)"}
        return {"kubernetes": None}

    return ready


@asynccontextmanager
async def open_loop_server(settings: UpSettings) -> AsyncIterator[RunningServer]:
    """Everything of `loopd up` but its operators (which is all of `loopd server`), running for the block's
    duration."""
    data_dir = settings.data_dir.expanduser().resolve()
    check_exposure(settings.host, public=settings.public)
    root = workspaces_root(data_dir, settings.workspaces)
    sandbox = settings.sandbox if settings.sandbox is not None else resolve_sandbox()
    if settings.kube_api == "kubeconfig" and settings.kubeconfig is None:
        raise ServerSetupError("a kubeconfig file is needed to reach the Kubernetes API (--kubeconfig FILE)")
    data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)
    with data_dir_lock(data_dir, LOCK_FILE, holder=settings.holder):
        async with AsyncExitStack() as stack:
            # The process's one clock: the stores, the harness rig, the engine, the bus (readers' polls), the
            # sweepers, the responder and reconcile all read time and sleep on it (tests pass a VirtualClock).
            clock = SystemClock()
            credentials = load_or_create_credentials(data_dir, clock=clock)
            store: ResourceStore | None = None
            if settings.kube_api == "embedded":
                store = await stack.enter_async_context(_open_store(settings, data_dir, clock))
            db = await stack.enter_async_context(
                open_database(settings.database_url or data_dir / "loopd.db", options=DatabaseOptions(clock=clock))
            )
            await _adopt_tokens(db, settings.actor_tokens)
            client: ResourceClient
            api_url: str | None = None
            if store is not None:
                api = await stack.enter_async_context(
                    open_api_server(
                        store,
                        credentials=credentials,
                        host=settings.host,
                        port=settings.api_port,
                        public=settings.public,
                        resolve_token=_responder_of(AccessStore(db)),
                        clock=clock,
                    )
                )
                write_endpoint(data_dir, api.url)
                api_url = api.url
                client = StoreClient(store)
            else:
                kubeconfig = settings.kubeconfig if settings.kube_api == "kubeconfig" else None
                client = await stack.enter_async_context(
                    open_http_client(kubeconfig, request_timeout=settings.kube_timeout)
                )

            replica_id = f"{socket.gethostname()}:{os.getpid()}:{new_id()[-12:]}"  # unique per process
            if settings.database_url is None:
                # Embedded: the data-dir lock proves every earlier holder of a lease in this database is gone.
                async with db.transaction() as tx:
                    await tx.leases.expire_others(replica_id)

            metrics = Metrics()  # this server's own registry (served at /metrics)
            targets = await _open_targets(stack, settings, data_dir, root, sandbox, clock, metrics)

            # Wake-ups (streams, engine drivers and waiters, the responder) reach every replica on the same PostgreSQL
            # through LISTEN/NOTIFY; with SQLite, this process only (loopd._infra.notify).
            notifier = await stack.enter_async_context(open_notifier(settings.database_url))
            bus = ConversationBus(clock=clock, notifier=notifier)
            registry = RegistryService(db, builtin_actors=list(targets.actors))
            gateway = ResourceTaskGateway(client, namespace=settings.namespace, timeout=settings.kube_timeout)
            conversations = ConversationReader(db, bus)
            chat = ChatRequests(db, bus, gateway, targets=registry, metrics=metrics)
            # Conversation titles: a background run per new conversation (the demo names it by its first words).
            title_model: Model = (
                ScriptedModel(lambda request: Reply(text=demo_title_reply(request)), model_name="demo")
                if settings.model.is_demo
                else await stack.enter_async_context(open_model(settings.model))
            )
            titles = await stack.enter_async_context(ConversationTitles(db, title_model, clock=clock))
            chat.asked = titles.note
            await titles.resume()
            task_api = TaskApi(db, bus, gateway, metrics=metrics)
            task_api.answered = titles.answered
            human = HumanService(chat)
            ledger = SqlLedgerStore(db)
            engine = HarnessEngine(
                db,
                ledger=ledger,
                adapters=targets.adapters,
                bus=bus,
                replica_id=replica_id,
                clock=clock,
                capacity=settings.engine_capacity,
                lease_ttl=settings.lease_ttl,
                metrics=metrics,
                redactor=ledger_redactor(settings),
            )
            await stack.enter_async_context(engine)
            # Titles and the Tasks' cleanup after an answer wait while questions asked here wait for their answers
            # or the engine runs calls (a burst of chats gets its answers first), up to their deadlines.
            answers = chat.answers = task_api.answers = OpenAnswers(clock)
            titles.busy = task_api.busy = lambda: answers.waiting() or engine.statistics().slots_used > 0
            engine.add_listener(lambda notice: _idle(titles, task_api) if notice.ended else None)

            manager = Manager(client, clock=clock, on_reconciled=metrics.reconcile_observer("server"))
            responder = HarnessResponder(
                client=client,
                engine=engine,
                chat=task_api,
                clock=clock,
                timeout=settings.call_timeout,
                forks=ConversationForks(chat),  # a fork's first answer starts from the source answer's session
                modes=chat,  # a conversation's mode: its built-in harness calls start in it
                questions=chat.questions,  # a Task whose question is still being stored waits for its commit
            )
            # Embedded: every namespace of the store (as before); a real cluster: only ours (a namespaced Role).
            watched = None if store is not None else settings.namespace
            # The responder's own status writes (phase, responder) and the Task's completion need no reconcile:
            # its wake-ups are the Task's creation, spec or metadata changes, and the engine's notices.
            manager.add_controller(
                TASKS,
                responder,
                workers=settings.task_workers,
                namespace=watched,
                label_selector=tasks_not_for("operator"),  # the operators' Tasks are not ours: not even sent
                event_filter=responder.event_filter,  # no status-only changes, no deletions (see there)
            )
            metrics.add_collector(lambda: _live_gauges(engine, conversations, responder))
            metrics.add_reconcile_source("server", manager.loads)
            background = await stack.enter_async_context(TaskSet("loop-server"))  # cancels what is left at exit
            background.start(task_api.run_cleanup(), name="loopd-task-cleanup")
            manager_task = background.start(manager.run(), name="loopd-reconcile-manager")
            if settings.ledger_retention is not None:
                retention = ArtifactRetention(ledger, settings.ledger_retention, clock)
                background.start(retention.run(), name="loopd-ledger-retention")

            async def stop_manager() -> None:
                manager.shutdown()
                await asyncio.wait([manager_task], timeout=15.0)  # then the task set cancels it if still running
                if manager_task.done():
                    manager_task.result()  # a manager that failed says so, as before

            stack.push_async_callback(stop_manager)

            ctx = ServerContext(
                db=db,
                bus=bus,
                security=ServerSecurity(tokens=(credentials.token, *settings.admin_tokens)),
                conversations=conversations,
                chat=chat,
                task_api=task_api,
                human=human,
                registry=registry,
                metrics=metrics,
            )
            app = create_server_app(
                ctx,
                routers=[
                    engine_router(engine, asker_of=task_api.asker_of, tasks=task_api, stopping=task_api.stopping),
                    ledger_router(ledger, tasks=task_api, conversations=conversations),
                ],
                readiness=_readiness(client, settings.namespace, timeout=min(settings.kube_timeout, 2.0)),
            )
            http = await stack.enter_async_context(open_http_server(app, host=settings.host, port=settings.port))
            token_file = credentials.directory / "token"
            server_file_info = {"url": http.url, "api_url": api_url, "pid": os.getpid(), "token_file": str(token_file)}
            stack.callback(lambda: (data_dir / SERVER_FILE).unlink(missing_ok=True))
            if settings.announce:
                write_server_file(data_dir, server_file_info)
            yield RunningServer(
                url=http.url,
                api_url=api_url,
                data_dir=data_dir,
                token_file=token_file,
                model=settings.model,
                db=db,
                conversations=conversations,
                chat=chat,
                engine=engine,
                workspace=targets.workspace,
                sandbox=sandbox,
                server_file_info=server_file_info,
                kube_api=settings.kube_api,
                harnesses=targets.actors,
                metrics=metrics,
                app=app,
            )


def _live_gauges(
    engine: HarnessEngine, conversations: ConversationReader, responder: HarnessResponder
) -> list[GaugeSample]:
    """The gauges /metrics reads from live state at each scrape: engine capacity, the Tasks waiting for it, SSE
    subscribers."""
    stats = engine.statistics()
    samples: list[GaugeSample] = [
        ("loopd_engine_capacity", "Harness call slots of this replica.", {}, stats.capacity),
        ("loopd_engine_slots_used", "Harness call slots in use (admitted or driven here).", {}, stats.slots_used),
        ("loopd_engine_driving", "Harness calls being driven by this replica.", {}, stats.driving),
        (
            "loopd_harness_tasks_waiting",
            "Tasks for a harness refused for capacity by this replica, waiting for a free slot.",
            {},
            responder.statistics().waiting_for_capacity,
        ),
        (
            "loopd_sse_subscribers",
            "Open conversation event streams (SSE) of this replica.",
            {},
            conversations.feeds.statistics().subscriptions,
        ),
    ]
    return samples


def _idle(titles: ConversationTitles, task_api: TaskApi) -> None:
    """A call ended: the work that waits for an idle engine may go ahead."""
    titles.idle()
    task_api.idle()


@asynccontextmanager
async def _open_store(settings: UpSettings, data_dir: Path, clock: Clock) -> AsyncIterator[ResourceStore]:
    """The embedded resource store: beside the server state in PostgreSQL (replicas share Tasks), else SQLite."""
    options = StoreOptions(clock=clock)
    if settings.database_url is not None:
        from loopd.resources import open_postgres_store

        async with open_postgres_store(settings.database_url, options=options) as store:
            yield store
    else:
        async with open_sqlite_store(data_dir / "resources.db", options=options) as store:
            yield store
