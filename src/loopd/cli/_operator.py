"""`loopd operator router`: the Router as its own process, and the composition `loopd up` runs in process.

Either way the Router reaches the server only through `loopd.runtime`: the HTTP API with a bearer token, and Tasks
and its Lease through the Kubernetes API with a kubeconfig. `resolve_connection` finds them from the flags:
``--server URL --token T [--kubeconfig PATH]`` for a remote server, or ``--data-dir DIR`` of a `loopd up` on this
machine (its ``server.json``, its admin token, and a kubeconfig for its embedded Kubernetes API built as
`loopd kubeconfig` builds one). `serve_router` registers `operator:router`, watches its Tasks with leader election on
a Lease (of several replicas one works; another takes over within the lease time when it dies) and runs until its
``stop`` event is set, then releases the Lease.

Must not import `loopd.server` (the CLI's `_up` composes the server and this).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit, urlunsplit

import typer
import yaml
from rich.console import Console

from loopd._infra.tasks import cancel_and_wait
from loopd._paths import default_data_dir
from loopd.cli._errors import EXIT_USAGE, CliError, cli_console, run_async
from loopd.resources import ResourceError, load_or_create_credentials, read_endpoint, render_kubeconfig

if TYPE_CHECKING:
    from loopd.operators.router import RouterSettings
    from loopd.resources.reconcile import LeaderElection

logger = logging.getLogger(__name__)

ROUTER_KEY: Final = "router"
ROUTER_ACTOR: Final = f"operator:{ROUTER_KEY}"
LEASE_SECONDS: Final = 15.0
SERVER_FILE: Final = "server.json"
ADMIN_TOKEN_FILE: Final = Path("resources-api") / "token"

operator_app = typer.Typer(
    help="Run loopd's operators as their own processes (the Router runs inside `loopd up` too).",
    no_args_is_help=True,
)


@dataclass(frozen=True)
class RouterConnection:
    """Where the Router reaches loop-server: its HTTP API (URL + bearer token) and its Kubernetes API."""

    server_url: str
    token: str
    kubeconfig: Path | Mapping[str, Any] | None
    """A kubeconfig path, a parsed kubeconfig, or None for the default (``$KUBECONFIG``, ``~/.kube/config``)."""
    namespace: str = "default"
    admin_of: Path | None = None
    """The data directory whose admin token ``token`` is: the runtime then speaks as `operator:router` with it
    (``X-Loopd-Actor``) instead of as the admin."""

    @property
    def acting_as_admin(self) -> bool:
        return self.admin_of is not None


def loopback_url(url: str) -> str:
    """``url`` with a wildcard listen address (0.0.0.0, ::) replaced by loopback: where a local process reaches it."""
    parts = urlsplit(url)
    host = (parts.hostname or "").strip("[]")
    if host not in ("0.0.0.0", "::"):  # compared with, never bound to
        return url
    loopback = "127.0.0.1" if host == "0.0.0.0" else "[::1]"
    return urlunsplit(parts._replace(netloc=f"{loopback}:{parts.port}" if parts.port else loopback))


def kubeconfig_for(data_dir: Path, token: str, *, namespace: str = "default") -> dict[str, Any]:
    """A parsed kubeconfig for the embedded Kubernetes API of the `loopd up` in ``data_dir``, sending ``token``.

    Built as `loopd kubeconfig --data-dir DIR --token T` prints it; `CliError` (exit 2) when no API is recorded there.
    """
    url = read_endpoint(data_dir)
    if not url:
        raise CliError(
            f"no running loopd API recorded in {data_dir}",
            "start `loopd up` there, or pass --server, --token and --kubeconfig",
            exit_code=EXIT_USAGE,
        )
    credentials = load_or_create_credentials(data_dir)
    parsed = yaml.safe_load(render_kubeconfig(loopback_url(url), credentials.ca_pem, token, namespace=namespace))
    if not isinstance(parsed, dict):  # render_kubeconfig always renders a mapping
        raise CliError(f"the kubeconfig built for {data_dir} is not a mapping")
    return parsed


def _recorded_url(data_dir: Path) -> str | None:
    try:
        info = json.loads((data_dir / SERVER_FILE).read_text())
    except (OSError, ValueError):
        return None
    url = info.get("url") if isinstance(info, dict) else None
    return loopback_url(str(url).rstrip("/")) if url else None


def resolve_connection(
    *,
    server: str | None,
    token: str | None,
    data_dir: Path | None,
    kubeconfig: Path | None,
    namespace: str = "default",
    env: Mapping[str, str] | None = None,
) -> RouterConnection:
    """The connection the flags (and ``LOOPD_SERVER`` / ``LOOPD_TOKEN`` / ``LOOPD_DATA_DIR``) describe.

    ``--server`` and ``--token`` win; a data directory (``--data-dir``, else the default one when ``--server`` is not
    given) fills in what is missing: the URL its `loopd up` recorded, its admin token, and a kubeconfig for its
    embedded API. Without a data directory, ``--server`` and ``--token`` are required and the kubeconfig is
    ``--kubeconfig`` or the default one. `CliError` (exit 2) names what is missing.
    """
    source = os.environ if env is None else env
    url = (server or source.get("LOOPD_SERVER") or "").rstrip("/") or None
    bearer = (token or source.get("LOOPD_TOKEN") or "").strip() or None
    directory = data_dir.expanduser() if data_dir is not None else None
    if directory is None and url is None:
        directory = default_data_dir(source).expanduser()
    admin_of: Path | None = None
    if directory is not None:
        recorded = _recorded_url(directory)
        if url is None:
            url = recorded
            if url is None:
                raise CliError(
                    f"no running `loopd up` recorded in {directory}",
                    "start it, or pass --data-dir of the server, or --server URL with --token",
                    exit_code=EXIT_USAGE,
                )
        if bearer is None:
            with contextlib.suppress(OSError):
                bearer = (directory / ADMIN_TOKEN_FILE).read_text().strip() or None
            if bearer is None:
                raise CliError(
                    f"no admin token in {directory / ADMIN_TOKEN_FILE}",
                    "pass --data-dir of the server, or --token (from `loopd token create operator:router`)",
                    exit_code=EXIT_USAGE,
                )
            admin_of = directory
    if url is None:  # pragma: no cover - a URL or a data directory is always there by now
        raise CliError("no server URL", "pass --server URL or --data-dir DIR", exit_code=EXIT_USAGE)
    if bearer is None:
        raise CliError(
            f"no token for {url}",
            "pass --token (from `loopd token create operator:router`) or set LOOPD_TOKEN, or --data-dir of the "
            "`loopd up` that serves it",
            exit_code=EXIT_USAGE,
        )
    config: Path | Mapping[str, Any] | None
    if kubeconfig is not None:
        config = kubeconfig.expanduser()
        if not config.is_file():
            raise CliError(f"no kubeconfig at {config}", "pass the path of a kubeconfig file", exit_code=EXIT_USAGE)
    elif directory is not None:
        config = kubeconfig_for(directory, bearer, namespace=namespace)
    else:
        config = None
    return RouterConnection(url, bearer, config, namespace=namespace, admin_of=admin_of)


def router_lease(
    lease_name: str, namespace: str, *, identity: str | None = None, duration: float = LEASE_SECONDS
) -> LeaderElection:
    """The Lease the Router's replicas elect a leader on. ``duration``: how long a standby waits, after the lease last
    changed, before taking it over; the leader renews every ``duration`` × 2/15 and steps down after failing to for
    ``duration`` × 2/3 (client-go's 15 s / 10 s / 2 s)."""
    from loopd.resources.reconcile import LeaderElection

    election = LeaderElection(
        lease_name,
        namespace=namespace,
        lease_duration=duration,
        renew_deadline=duration * 2 / 3,
        retry_period=duration * 2 / 15,
    )
    return election if identity is None else replace(election, identity=identity)


async def serve_router(
    connection: RouterConnection,
    settings: RouterSettings,
    *,
    stop: asyncio.Event,
    lease: LeaderElection | None,
    abort: asyncio.Event | None = None,
    drain: float | None = None,
    on_registered: Callable[[], None] | None = None,
) -> None:
    """Run the Router until ``stop`` is set: register `operator:router` (renewed in the background), reconcile its
    Tasks (with leader election on ``lease`` when given), then stop taking Tasks, let the answers in progress finish
    and release the Lease.

    The answers in progress get at most ``drain`` seconds (None: the reconcile manager's own bound, 30 s), or until
    ``abort`` is set; what is cut short then is cancelled — its harness calls go on in the server, and the next
    Router re-attaches to them. Errors the runtime cannot retry (a refused token, an unreachable server at start)
    propagate.
    """
    from loopd.operators.router import Router
    from loopd.runtime import open_runtime

    async with open_runtime(
        connection.server_url,
        token=None if connection.acting_as_admin else connection.token,
        data_dir=connection.admin_of,
        kubeconfig=connection.kubeconfig,
        namespace=connection.namespace,
    ) as rt:
        router = Router(rt, settings)
        await router.register()
        if on_registered is not None:
            on_registered()
        router.watch(leader_election=lease)
        async with asyncio.TaskGroup() as group:
            running = group.create_task(rt.run(), name="loopd-router")
            await _until(running, stop)
            if not running.done():
                rt.shutdown()
                await _until(running, abort, timeout=drain)
                if not running.done():
                    logger.warning("the Router stops without waiting for its answers in progress")
                    running.cancel()


async def _until(task: asyncio.Task[None], event: asyncio.Event | None, *, timeout: float | None = None) -> None:
    """Wait until ``task`` is done, ``event`` is set or ``timeout`` passes, whichever comes first."""
    waiter = asyncio.ensure_future(event.wait()) if event is not None else None
    try:
        await asyncio.wait(
            {task} if waiter is None else {task, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        await cancel_and_wait(waiter)  # owned: ended and awaited, never left pending


def describe_router_error(exc: BaseException, connection: RouterConnection) -> CliError | None:
    """The one line for a failure of the Router's process (None: not one of the runtime's or the API's errors)."""
    from loopd.operators.router import RouterSettingsError
    from loopd.runtime import Forbidden, RuntimeApiError, Unauthorized, Unavailable

    if isinstance(exc, RouterSettingsError):
        return CliError(str(exc), exit_code=EXIT_USAGE)
    if isinstance(exc, Unauthorized):
        return CliError(
            f"{connection.server_url} refused the token: {exc.message}",
            "pass a token from `loopd token create operator:router`, or --data-dir of the server",
        )
    if isinstance(exc, Forbidden):
        return CliError(
            f"{connection.server_url} does not let this token act as {ROUTER_ACTOR}: {exc.message}",
            "use a token made for operator:router (`loopd token create operator:router`)",
        )
    if isinstance(exc, Unavailable):
        return CliError(f"cannot reach loopd at {connection.server_url}: {exc.message}", "is the server running?")
    if isinstance(exc, RuntimeApiError):
        return CliError(f"loopd at {connection.server_url} answered {exc.status} {exc.type}: {exc.message}")
    if isinstance(exc, ResourceError):
        return CliError(
            f"the Kubernetes API failed: {type(exc).__name__}: {exc}",
            "check --kubeconfig (or --data-dir) and that the API is running",
        )
    return None


@operator_app.command("router")
def router_command(
    server: str | None = typer.Option(
        None, "--server", help="loop-server's URL (default: $LOOPD_SERVER, else what --data-dir's `loopd up` recorded)."
    ),
    token: str | None = typer.Option(
        None,
        "--token",
        help="A token made for operator:router (loopd token create operator:router; default: $LOOPD_TOKEN, else "
        "the admin token of --data-dir). Other local users can see command lines: prefer LOOPD_TOKEN.",
    ),
    data_dir: Path | None = typer.Option(
        None,
        "--data-dir",
        help="The data directory of a loopd up on this machine: its URL, its token and its Kubernetes API "
        "(default: $LOOPD_DATA_DIR, else ~/.local/share/loopd, when --server is not given).",
    ),
    kubeconfig: Path | None = typer.Option(
        None,
        "--kubeconfig",
        help="The Kubernetes API holding the Tasks and the Lease (default: the embedded one of --data-dir, else "
        "$KUBECONFIG or ~/.kube/config).",
    ),
    namespace: str = typer.Option("default", "--namespace", "-n", help="The namespace of the Tasks and the Lease."),
    max_subtasks: int | None = typer.Option(
        None, "--max-subtasks", help="Most tasks a plan may split a request into ($LOOPD_ROUTER_MAX_SUBTASKS, 4)."
    ),
    concurrency: int | None = typer.Option(
        None, "--concurrency", help="Tasks worked on at once ($LOOPD_ROUTER_CONCURRENCY, 4)."
    ),
    target: str | None = typer.Option(
        None, "--target", help="The harness every call goes to ($LOOPD_ROUTER_TARGET, the built-in assistant)."
    ),
    lease_name: str = typer.Option(
        ROUTER_KEY, "--lease-name", help="The Lease the replicas elect a leader on: one works at a time."
    ),
    lease_duration: float = typer.Option(
        LEASE_SECONDS,
        "--lease-duration",
        min=1.0,
        help="Seconds after the leader last renewed the Lease before another replica takes over (it renews every "
        "2/15 of this).",
    ),
) -> None:
    """Run the Router (operator:router) against a running loop-server, with leader election between replicas."""
    from loopd.operators.router import RouterSettings, RouterSettingsError

    try:
        settings = RouterSettings.from_env(max_subtasks=max_subtasks, concurrency=concurrency, target=target)
    except RouterSettingsError as exc:
        raise CliError(str(exc), exit_code=EXIT_USAGE) from exc
    connection = resolve_connection(
        server=server, token=token, data_dir=data_dir, kubeconfig=kubeconfig, namespace=namespace
    )
    lease = router_lease(lease_name, namespace, duration=lease_duration)
    console = cli_console()
    try:
        run_async(_standalone(connection, settings, lease, console))
    except Exception as exc:
        cause = _first_error(exc)
        error = describe_router_error(cause, connection)
        if error is not None:
            raise error from cause
        if cause is not exc:
            raise cause from exc  # the app's report shows its one line, not "ExceptionGroup"
        raise


def _first_error(exc: Exception) -> Exception:
    """The first leaf of an exception group (task groups wrap what failed inside them); ``exc`` otherwise."""
    while isinstance(exc, ExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def _standalone(
    connection: RouterConnection, settings: RouterSettings, lease: LeaderElection, console: Console
) -> None:
    stop = asyncio.Event()
    abort = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            abort.set()
            return
        stop.set()
        console.print("stopping: answers in progress may finish (up to 30 s); press Ctrl-C again to stop at once")

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal)

    def registered() -> None:
        console.print(
            f"[bold green]Router[/] registered as {ROUTER_ACTOR} at {connection.server_url}; lease "
            f"{lease.namespace}/{lease.lease_name} as {lease.identity} (pid {os.getpid()}, host {socket.gethostname()})"
            ". Ctrl-C stops.",
            markup=True,
        )

    await serve_router(connection, settings, stop=stop, abort=abort, lease=lease, on_registered=registered)
    console.print("Router stopped")
