"""The composition root of one loop-server process (`loopd up`): everything wired, started and stopped in order.

    data dir ─┬─ loopd.lock          exclusive: one embedded server per data directory
              ├─ loopd.db            conversations, messages, event logs, human requests, harness calls, ledger
              ├─ resources.db        the Kubernetes-compatible store (Tasks, Leases)
              ├─ resources-api/      CA, server certificate, the token (0600), the API endpoint
              ├─ harness/journal.db  the built-in harness's journal
              └─ server.json         where this server listens (read by `loopd chat`)

    <data dir>-workspaces/assistant   the built-in `assistant` harness's workspace (`--workspaces` moves it)
    <data dir>-workspaces/<kind>/<key>/<id>   a harness call's own workspace (``workspace``: an operator's Run)

Workspaces live outside the data directory, which holds the credentials: a command in a workspace must not
reach them through ``..``. The rig's bash runs in the sandbox of `UpSettings.sandbox`, which also hides the
data directory should it lie inside a workspace. A workspace found at the old place, ``<data dir>/workspaces``,
is moved to the new one at start when the new one does not exist yet.

Start order: lock → credentials → resource store → database → the store's TLS API (it resolves responder tokens
through the database) → built-in harness rig → engine → responder (reconcile manager on Tasks) → HTTP API. Stop
order is the reverse, so nothing is used after it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from loopd._infra.clock import SystemClock
from loopd._infra.http import is_loopback
from loopd._infra.ids import new_id
from loopd._infra.locking import data_dir_lock
from loopd._infra.notify import open_notifier
from loopd._infra.tasks import TaskSet
from loopd.harness.models import DemoRule, ModelConfig
from loopd.harness.standard import HarnessSettings, open_standard_rig, workspace_rigs
from loopd.harness.tools import Sandbox, resolve_sandbox
from loopd.resources import (
    StoreOptions,
    TokenResolver,
    load_or_create_credentials,
    open_api_server,
    open_sqlite_store,
    write_endpoint,
)
from loopd.resources.client import TASKS, StoreClient
from loopd.resources.reconcile import Manager
from loopd.server._errors import ServerSetupError
from loopd.server.app import ServerContext, create_server_app
from loopd.server.audit import ledger_router
from loopd.server.chat import ChatRequests, ConversationReader, ResourceTaskGateway, TaskApi
from loopd.server.engine import BuiltinHarnessAdapter, HarnessEngine, engine_router
from loopd.server.http import AccessStore, ServerSecurity, open_http_server
from loopd.server.human import HumanService
from loopd.server.ledger import SqlLedgerStore
from loopd.server.registry import ActorInfo, RegistryService
from loopd.server.responder import HarnessResponder
from loopd.server.storage import Database, DatabaseOptions, StorageError, open_database
from loopd.server.streams import ConversationBus

DEFAULT_PORT: Final = 8420
SERVER_FILE: Final = "server.json"
LOCK_FILE: Final = "loopd.lock"
ASSISTANT: Final = "assistant"
ASSISTANT_DESCRIPTION: Final = "The built-in harness: file and bash tools in its own workspace, with permission gates."


@dataclass(frozen=True)
class UpSettings:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_port: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    database_url: str | None = None
    """PostgreSQL DSN for the server state (default: SQLite in the data directory)."""
    lease_ttl: float = 30.0
    engine_capacity: int = 50
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
    url: str
    api_url: str
    data_dir: Path
    token_file: Path
    model: ModelConfig
    db: Database
    conversations: ConversationReader
    chat: ChatRequests
    engine: HarnessEngine
    workspace: Path
    sandbox: Sandbox
    server_file_info: dict[str, Any] = field(default_factory=dict, repr=False)

    def announce(self) -> None:
        """Write ``server.json`` (where clients such as `loopd chat` find this server). Idempotent; removed when
        the server stops."""
        _write_server_file(self.data_dir, self.server_file_info)


def read_server_file(data_dir: Path) -> dict[str, Any] | None:
    """What a running `loopd up` recorded about itself in ``data_dir`` (None when nothing is recorded)."""
    try:
        data = json.loads((data_dir / SERVER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_server_file(data_dir: Path, info: dict[str, Any]) -> None:
    tmp = data_dir / f".{SERVER_FILE}.tmp"
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, data_dir / SERVER_FILE)


def _responder_of(access: AccessStore) -> TokenResolver:
    """The Kubernetes-compatible API's view of loop-server's actor tokens: a token → ``operator:<key>`` / ...."""

    async def resolve(token: str) -> str | None:
        try:
            actor = await access.token_actor(token)
        except StorageError:
            return None  # refused (401) rather than a 500; the HTTP API reports the storage failure itself
        return None if actor is None else actor.text

    return resolve


@asynccontextmanager
async def open_loop_server(settings: UpSettings) -> AsyncIterator[RunningServer]:
    """Everything of `loopd up`, running for the block's duration."""
    data_dir = settings.data_dir.expanduser().resolve()
    check_exposure(settings.host, public=settings.public)
    workspace = workspaces_root(data_dir, settings.workspaces) / ASSISTANT
    sandbox = settings.sandbox if settings.sandbox is not None else resolve_sandbox()
    data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)
    with data_dir_lock(data_dir, LOCK_FILE, holder="loopd up"):
        async with AsyncExitStack() as stack:
            # The process's one clock: the stores, the harness rig, the engine, the bus (readers' polls), the
            # sweepers, the responder and reconcile all read time and sleep on it (tests pass a VirtualClock).
            clock = SystemClock()
            credentials = load_or_create_credentials(data_dir, clock=clock)
            store = await stack.enter_async_context(
                open_sqlite_store(data_dir / "resources.db", options=StoreOptions(clock=clock))
            )
            db = await stack.enter_async_context(
                open_database(settings.database_url or data_dir / "loopd.db", options=DatabaseOptions(clock=clock))
            )
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

            replica_id = f"{socket.gethostname()}:{os.getpid()}:{new_id()[-12:]}"  # unique per process
            if settings.database_url is None:
                # Embedded: the data-dir lock proves every earlier holder of a lease in this database is gone.
                async with db.transaction() as tx:
                    await tx.leases.expire_others(replica_id)

            _move_old_workspace(data_dir, workspace)
            harness_settings = HarnessSettings(
                workspace=workspace,
                data_dir=data_dir / "harness",
                model=settings.model,
                journal_dsn=settings.database_url,  # with PostgreSQL, any replica can resume a call
                sandbox=sandbox,
                hidden=(data_dir,),
                demo_rules=settings.demo_rules,
            )
            rig = await stack.enter_async_context(open_standard_rig(harness_settings, clock=clock))
            # Calls that name their own workspace (an operator's Executor / Auditor) work under the same root,
            # in <root>/<caller kind>/<caller key>/<id>, beside the assistant's <root>/assistant.
            call_workspaces = workspace_rigs(rig, harness_settings, workspace.parent)

            # Wake-ups (streams, engine drivers and waiters, the responder) reach every replica on the same PostgreSQL
            # through LISTEN/NOTIFY; with SQLite, this process only (loopd._infra.notify).
            notifier = await stack.enter_async_context(open_notifier(settings.database_url))
            bus = ConversationBus(clock=clock, notifier=notifier)
            client = StoreClient(store)
            registry = RegistryService(
                db, builtin_actors=[ActorInfo("harness", ASSISTANT, "Assistant", ASSISTANT_DESCRIPTION)]
            )
            gateway = ResourceTaskGateway(client)
            conversations = ConversationReader(db, bus)
            chat = ChatRequests(db, bus, gateway, targets=registry)
            task_api = TaskApi(db, bus, gateway)
            human = HumanService(chat)
            ledger = SqlLedgerStore(db)
            engine = HarnessEngine(
                db,
                ledger=ledger,
                adapters={ASSISTANT: BuiltinHarnessAdapter(rig, workspaces=call_workspaces)},
                bus=bus,
                replica_id=replica_id,
                clock=clock,
                capacity=settings.engine_capacity,
                lease_ttl=settings.lease_ttl,
            )
            await stack.enter_async_context(engine)

            manager = Manager(client, clock=clock)
            responder = HarnessResponder(client=client, engine=engine, chat=task_api, clock=clock)
            manager.add_controller(TASKS, responder, workers=8)
            background = await stack.enter_async_context(TaskSet("loopd up"))  # cancels what is left at exit
            manager_task = background.start(manager.run(), name="loopd-reconcile-manager")

            async def stop_manager() -> None:
                manager.shutdown()
                await asyncio.wait([manager_task], timeout=15.0)  # then the task set cancels it if still running
                if manager_task.done():
                    manager_task.result()  # a manager that failed says so, as before

            stack.push_async_callback(stop_manager)

            ctx = ServerContext(
                db=db,
                bus=bus,
                security=ServerSecurity(tokens=(credentials.token,)),
                conversations=conversations,
                chat=chat,
                task_api=task_api,
                human=human,
                registry=registry,
            )
            app = create_server_app(
                ctx,
                routers=[
                    engine_router(engine, asker_of=task_api.asker_of, tasks=task_api, stopping=task_api.stopping),
                    ledger_router(ledger, tasks=task_api, conversations=conversations),
                ],
            )
            http = await stack.enter_async_context(open_http_server(app, host=settings.host, port=settings.port))
            token_file = credentials.directory / "token"
            server_file_info = {"url": http.url, "api_url": api.url, "pid": os.getpid(), "token_file": str(token_file)}
            stack.callback(lambda: (data_dir / SERVER_FILE).unlink(missing_ok=True))
            if settings.announce:
                _write_server_file(data_dir, server_file_info)
            yield RunningServer(
                url=http.url,
                api_url=api.url,
                data_dir=data_dir,
                token_file=token_file,
                model=settings.model,
                db=db,
                conversations=conversations,
                chat=chat,
                engine=engine,
                workspace=workspace,
                sandbox=sandbox,
                server_file_info=server_file_info,
            )
