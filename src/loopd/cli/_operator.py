"""`loopd operator router` / `loopd operator longhorizon`: loopd's operators as their own processes, and the
composition `loopd up` runs in process.

Either way an operator reaches the server only through `loopd.runtime`: the HTTP API with a bearer token, and Tasks,
its own resources and its Lease through the Kubernetes API with a kubeconfig. `resolve_connection` finds them from
the flags: ``--server URL --token T [--kubeconfig PATH]`` for a remote server, or ``--data-dir DIR`` of a `loopd up`
on this machine (its ``server.json``, its admin token, and a kubeconfig for its embedded Kubernetes API built as
`loopd kubeconfig` builds one). An `OperatorProgram` says how to start one operator (`router_program`,
`longhorizon_program`: the LongHorizon program first ensures its CRDs); `serve_operator` registers it, watches its
Tasks with leader election on a Lease (of several replicas one works; another takes over within the lease time when
it dies) and runs until its ``stop`` event is set, then releases the Lease.

Must not import `loopd.server` (the CLI's `_up` composes the server and this).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol
from urllib.parse import urlsplit, urlunsplit

import typer
import yaml
from rich.console import Console

from loopd._infra.heap import settle_startup_heap
from loopd._infra.metrics import Metrics, MetricsExposureError, open_metrics_server
from loopd._infra.tasks import cancel_and_wait
from loopd._paths import default_data_dir, read_server_file
from loopd.cli._errors import EXIT_USAGE, CliError, cli_console, run_async
from loopd.resources import ResourceError, load_or_create_credentials, read_endpoint, render_kubeconfig

if TYPE_CHECKING:
    import httpx

    from loopd.operators.longhorizon import LongHorizonSettings
    from loopd.operators.router import RouterSettings
    from loopd.resources.reconcile import LeaderElection
    from loopd.runtime import Runtime

logger = logging.getLogger(__name__)

ROUTER_KEY: Final = "router"
ROUTER_ACTOR: Final = f"operator:{ROUTER_KEY}"
LONGHORIZON_KEY: Final = "longhorizon"
LONGHORIZON_LEASE: Final = "longhorizon.loopd.dev"
LEASE_SECONDS: Final = 15.0
ADMIN_TOKEN_FILE: Final = Path("resources-api") / "token"

operator_app = typer.Typer(
    help="Run loopd's operators as their own processes (the Router and LongHorizon run inside `loopd up` too).",
    no_args_is_help=True,
)


@dataclass(frozen=True)
class OperatorConnection:
    """Where an operator reaches loop-server: its HTTP API (URL + bearer token) and its Kubernetes API."""

    server_url: str
    token: str
    kubeconfig: Path | Mapping[str, Any] | None
    """A kubeconfig path, a parsed kubeconfig, or None for the default (``$KUBECONFIG``, ``~/.kube/config``)."""
    namespace: str = "default"
    admin_of: Path | None = None
    """The data directory whose admin token ``token`` is: the runtime then speaks as the operator with it
    (``X-Loopd-Actor: operator:<key>``) instead of as the admin."""

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
    url = (read_server_file(data_dir) or {}).get("url")
    return loopback_url(str(url).rstrip("/")) if url else None


def resolve_connection(
    *,
    server: str | None,
    token: str | None,
    data_dir: Path | None,
    kubeconfig: Path | None,
    namespace: str = "default",
    env: Mapping[str, str] | None = None,
) -> OperatorConnection:
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
                    "pass --data-dir of the server, or --token (from `loopd token create operator:<key>`)",
                    exit_code=EXIT_USAGE,
                )
            admin_of = directory
    if url is None:  # pragma: no cover - a URL or a data directory is always there by now
        raise CliError("no server URL", "pass --server URL or --data-dir DIR", exit_code=EXIT_USAGE)
    if bearer is None:
        raise CliError(
            f"no token for {url}",
            "pass --token (from `loopd token create operator:<key>`) or set LOOPD_TOKEN, or --data-dir of the "
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
        _check_default_kubeconfig(source)
        config = None
    return OperatorConnection(url, bearer, config, namespace=namespace, admin_of=admin_of)


def _check_default_kubeconfig(source: Mapping[str, str]) -> None:
    """Without --kubeconfig or a data directory the client takes ``$KUBECONFIG``, else ``~/.kube/config``, else the
    pod's service account: `CliError` (exit 2) when none of them is there, instead of the client's own error."""
    from_env = source.get("KUBECONFIG", "").split(os.pathsep)[0]
    if from_env:
        if not Path(from_env).expanduser().is_file():
            raise CliError(
                f"no kubeconfig at {from_env} ($KUBECONFIG)",
                "set KUBECONFIG to a kubeconfig file, or pass --kubeconfig",
                exit_code=EXIT_USAGE,
            )
        return
    home = source.get("HOME")
    default = (Path(home) if home else Path.home()) / ".kube" / "config"
    if default.is_file() or source.get("KUBERNETES_SERVICE_HOST"):
        return
    raise CliError(
        f"no Kubernetes API to use: --server was given without --kubeconfig, and there is no $KUBECONFIG or {default}",
        "pass --kubeconfig FILE (`loopd kubeconfig --token TOKEN` writes one for loopd's own API), or --data-dir of "
        "the server",
        exit_code=EXIT_USAGE,
    )


def operator_lease(
    lease_name: str, namespace: str, *, identity: str | None = None, duration: float = LEASE_SECONDS
) -> LeaderElection:
    """The Lease an operator's replicas elect a leader on. ``duration``: how long a standby waits, after the lease
    last changed, before taking it over; the leader renews every ``duration`` × 2/15 and steps down after failing to
    for ``duration`` × 2/3 (client-go's 15 s / 10 s / 2 s)."""
    from loopd.resources.reconcile import LeaderElection

    election = LeaderElection(
        lease_name,
        namespace=namespace,
        lease_duration=duration,
        renew_deadline=duration * 2 / 3,
        retry_period=duration * 2 / 15,
    )
    return election if identity is None else replace(election, identity=identity)


class ServedOperator(Protocol):
    """What `serve_operator` runs: an operator object of `loopd.operators` (the Router, LongHorizon)."""

    async def register(self) -> None:
        """List the operator in ``/v1/actors`` (renewed in the background by the runtime)."""
        ...

    def watch(self, *, leader_election: LeaderElection | None = None) -> None:
        """Bind its reconcilers to the runtime (run by ``rt.run()``), under ``leader_election`` when given."""
        ...


@dataclass(frozen=True)
class OperatorProgram:
    """How to run one of loopd's operators: its key (``operator:<key>``), its name in messages, its default Lease,
    and ``start``, which builds it on an open runtime (and prepares what it needs there, e.g. its CRDs)."""

    key: str
    title: str
    lease_name: str
    start: Callable[[Runtime], Awaitable[ServedOperator]]
    answering: str = "answers"
    """What is cut short when it stops (for messages): its "answers" or "runs" in progress."""

    @property
    def actor(self) -> str:
        return f"operator:{self.key}"


def router_program(settings: RouterSettings) -> OperatorProgram:
    """The Router (``operator:router``) with ``settings``, electing its leader on the Lease ``router``."""

    async def start(rt: Runtime) -> ServedOperator:
        from loopd.operators.router import Router

        return Router(rt, settings)

    return OperatorProgram(ROUTER_KEY, "Router", ROUTER_KEY, start)


def longhorizon_program(settings: LongHorizonSettings) -> OperatorProgram:
    """LongHorizon (``operator:longhorizon``) with ``settings``; its start makes sure the Run / Execution / Audit
    CRDs are installed and Established (created or updated) before it watches anything. Lease
    ``longhorizon.loopd.dev``."""

    async def start(rt: Runtime) -> ServedOperator:
        from loopd.operators.longhorizon import LongHorizon, crds

        await rt.ensure_crds(crds())
        return LongHorizon(rt, settings)

    return OperatorProgram(LONGHORIZON_KEY, "LongHorizon", LONGHORIZON_LEASE, start, answering="runs")


async def serve_operator(
    connection: OperatorConnection,
    program: OperatorProgram,
    *,
    stop: asyncio.Event,
    lease: LeaderElection | None,
    abort: asyncio.Event | None = None,
    drain: float | None = None,
    on_registered: Callable[[], None] | None = None,
    metrics: Metrics | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> None:
    """Run ``program``'s operator until ``stop`` is set: start it (e.g. its CRDs), register ``operator:<key>``
    (renewed in the background), reconcile (with leader election on ``lease`` when given), then stop taking work, let
    the work in progress finish and release the Lease.

    The work in progress gets at most ``drain`` seconds (None: the reconcile manager's own bound, 30 s), or until
    ``abort`` is set; what is cut short then is cancelled — its harness calls go on in the server, and the next
    start re-attaches to them. Errors the runtime cannot retry (a refused token, an unreachable server at start)
    propagate. With ``metrics`` its reconciles (latency, queue depth) are reported there under its key; with
    ``transport`` its requests to loop-server go through it (`loopd up`: the server's app, in process).
    """
    from loopd.runtime import open_runtime

    async with open_runtime(
        connection.server_url,
        token=None if connection.acting_as_admin else connection.token,
        data_dir=connection.admin_of,
        kubeconfig=connection.kubeconfig,
        namespace=connection.namespace,
        transport=transport,
    ) as rt:
        if metrics is not None:
            rt.report_metrics(metrics, program.key)
        operator = await program.start(rt)
        await operator.register()
        if on_registered is not None:
            on_registered()
        operator.watch(leader_election=lease)
        async with asyncio.TaskGroup() as group:
            running = group.create_task(rt.run(), name=f"loopd-{program.key}")
            await _until(running, stop)
            if not running.done():
                rt.shutdown()
                await _until(running, abort, timeout=drain)
                if not running.done():
                    logger.warning(
                        "the %s stops without waiting for its %s in progress", program.title, program.answering
                    )
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


def describe_operator_error(
    exc: BaseException, connection: OperatorConnection, program: OperatorProgram
) -> CliError | None:
    """The one line for a failure of an operator's process (None: not one of the runtime's or the API's errors)."""
    from loopd.operators.longhorizon import LongHorizonSettingsError
    from loopd.operators.router import RouterSettingsError
    from loopd.runtime import Forbidden, RuntimeApiError, Unauthorized, Unavailable

    if isinstance(exc, RouterSettingsError | LongHorizonSettingsError):
        return CliError(str(exc), exit_code=EXIT_USAGE)
    if isinstance(exc, Unauthorized):
        return CliError(
            f"{connection.server_url} refused the token: {exc.message}",
            f"pass a token from `loopd token create {program.actor}`, or --data-dir of the server",
        )
    if isinstance(exc, Forbidden):
        return CliError(
            f"{connection.server_url} does not let this token act as {program.actor}: {exc.message}",
            f"use a token made for {program.actor} (`loopd token create {program.actor}`)",
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


_SERVER_HELP: Final = "loop-server's URL (default: $LOOPD_SERVER, else what --data-dir's `loopd up` recorded)."
_DATA_DIR_HELP: Final = (
    "The data directory of a loopd up on this machine: its URL, its token and its Kubernetes API "
    "(default: $LOOPD_DATA_DIR, else ~/.local/share/loopd, when --server is not given)."
)
_KUBECONFIG_HELP: Final = (
    "The Kubernetes API holding the Tasks and the Lease (default: the embedded one of --data-dir, else "
    "$KUBECONFIG or ~/.kube/config)."
)
_LEASE_DURATION_HELP: Final = (
    "Seconds after the leader last renewed the Lease before another replica takes over (it renews every 2/15 of this)."
)
METRICS_TOKEN_ENV: Final = "LOOPD_METRICS_TOKEN"
_METRICS_PORT_HELP: Final = (
    "Serve Prometheus metrics (reconcile latency, queue depth) at http://<metrics-host>:<port>/metrics; 0 picks a free "
    "port. Scrapes need $LOOPD_METRICS_TOKEN as a bearer token when it is set, else only loopback may scrape."
)
_METRICS_HOST_HELP: Final = "The address of --metrics-port (anything but loopback needs $LOOPD_METRICS_TOKEN)."


def _token_help(actor: str) -> str:
    return (
        f"A token made for {actor} (loopd token create {actor}; default: $LOOPD_TOKEN, else the admin token of "
        "--data-dir). Other local users can see command lines: prefer LOOPD_TOKEN."
    )


@operator_app.command("router")
def router_command(
    server: str | None = typer.Option(None, "--server", help=_SERVER_HELP),
    token: str | None = typer.Option(None, "--token", help=_token_help(ROUTER_ACTOR)),
    data_dir: Path | None = typer.Option(None, "--data-dir", help=_DATA_DIR_HELP),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help=_KUBECONFIG_HELP),
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
    lease_duration: float = typer.Option(LEASE_SECONDS, "--lease-duration", min=1.0, help=_LEASE_DURATION_HELP),
    metrics_port: int | None = typer.Option(None, "--metrics-port", min=0, max=65535, help=_METRICS_PORT_HELP),
    metrics_host: str = typer.Option("127.0.0.1", "--metrics-host", help=_METRICS_HOST_HELP),
) -> None:
    """Run the Router (operator:router) against a running loop-server, with leader election between replicas."""
    from loopd.operators.router import RouterSettings, RouterSettingsError

    try:
        settings = RouterSettings.from_env(max_subtasks=max_subtasks, concurrency=concurrency, target=target)
    except RouterSettingsError as exc:
        message = str(exc)  # a field's error names its flag when given, else its variable
        for name, value in (("max_subtasks", max_subtasks), ("concurrency", concurrency), ("target", target)):
            if message.startswith(f"{name} must"):
                label = "--" + name.replace("_", "-") if value is not None else f"LOOPD_ROUTER_{name.upper()}"
                message = label + message[len(name) :]
                break
        raise CliError(message, exit_code=EXIT_USAGE) from exc
    _run_standalone(
        router_program(settings),
        resolve_connection(server=server, token=token, data_dir=data_dir, kubeconfig=kubeconfig, namespace=namespace),
        operator_lease(lease_name, namespace, duration=lease_duration),
        _MetricsOptions(metrics_port, metrics_host),
    )


_DURATION_FLAGS: Final = (
    "manager_timeout",
    "executor_timeout",
    "auditor_timeout",
    "human_timeout",
    "run_timeout",
    "retention_ttl",
)


def longhorizon_settings(env: Mapping[str, str] | None = None, **flags: str | int | None) -> LongHorizonSettings:
    """`LongHorizonSettings` from the command's flags (``max_rounds=``, ``manager_timeout="5m"``, …; None: not
    given) over ``LOOPD_LH_*``; a bad value is a `CliError` (exit 2) naming the flag or the variable."""
    from loopd.operators.longhorizon import ENV_PREFIX, LongHorizonSettings, LongHorizonSettingsError

    source = dict(os.environ if env is None else env)
    named: dict[str, str] = {}
    for name, value in flags.items():
        if value is None:
            continue
        variable = ENV_PREFIX + name.upper()
        source[variable] = str(value)  # parsed like the variable, so a flag and its variable mean the same
        named[variable] = "--" + name.replace("_", "-")
    try:
        return LongHorizonSettings.from_env(source)
    except LongHorizonSettingsError as exc:
        message = str(exc)
        for variable, flag in named.items():
            message = message.replace(variable, flag)
        raise CliError(message, exit_code=EXIT_USAGE) from exc


@operator_app.command("longhorizon")
def longhorizon_command(
    server: str | None = typer.Option(None, "--server", help=_SERVER_HELP),
    token: str | None = typer.Option(None, "--token", help=_token_help(f"operator:{LONGHORIZON_KEY}")),
    data_dir: Path | None = typer.Option(None, "--data-dir", help=_DATA_DIR_HELP),
    kubeconfig: Path | None = typer.Option(
        None,
        "--kubeconfig",
        help="The Kubernetes API holding the Tasks, the Runs / Executions / Audits and the Lease (default: the "
        "embedded one of --data-dir, else $KUBECONFIG or ~/.kube/config).",
    ),
    namespace: str = typer.Option(
        "default", "--namespace", "-n", help="The namespace of the Tasks, the Runs and the Lease."
    ),
    max_rounds: int | None = typer.Option(
        None, "--max-rounds", help="Round budget of a new Run, 1..1000 ($LOOPD_LH_MAX_ROUNDS, 25)."
    ),
    manager_timeout: str | None = typer.Option(
        None, "--manager-timeout", help="One Manager call, e.g. 300, 90s, 5m ($LOOPD_LH_MANAGER_TIMEOUT, 5m)."
    ),
    executor_timeout: str | None = typer.Option(
        None, "--executor-timeout", help="One Executor call ($LOOPD_LH_EXECUTOR_TIMEOUT, 30m)."
    ),
    auditor_timeout: str | None = typer.Option(
        None, "--auditor-timeout", help="One Auditor call ($LOOPD_LH_AUDITOR_TIMEOUT, 5m)."
    ),
    human_timeout: str | None = typer.Option(
        None, "--human-timeout", help="How long a question to the person waits ($LOOPD_LH_HUMAN_TIMEOUT, 30m)."
    ),
    run_timeout: str | None = typer.Option(
        None, "--run-timeout", help="A Run's deadline after it starts ($LOOPD_LH_RUN_TIMEOUT, 24h)."
    ),
    retention_ttl: str | None = typer.Option(
        None, "--retention-ttl", help="How long a finished Run is kept ($LOOPD_LH_RETENTION_TTL, 24h)."
    ),
    workspace: str | None = typer.Option(
        None,
        "--workspace",
        help="Where the Runs' workspaces go, relative to the server's workspaces of operator:longhorizon: a Run "
        "works in <this>/<run uid> ($LOOPD_LH_WORKSPACE, runs).",
    ),
    target: str | None = typer.Option(
        None, "--target", help="The harness every role's call goes to ($LOOPD_LH_TARGET, the built-in assistant)."
    ),
    concurrency: int | None = typer.Option(
        None, "--concurrency", help="Tasks worked on at once ($LOOPD_LH_CONCURRENCY, 4)."
    ),
    lease_name: str = typer.Option(
        LONGHORIZON_LEASE, "--lease-name", help="The Lease the replicas elect a leader on: one works at a time."
    ),
    lease_duration: float = typer.Option(LEASE_SECONDS, "--lease-duration", min=1.0, help=_LEASE_DURATION_HELP),
    metrics_port: int | None = typer.Option(None, "--metrics-port", min=0, max=65535, help=_METRICS_PORT_HELP),
    metrics_host: str = typer.Option("127.0.0.1", "--metrics-host", help=_METRICS_HOST_HELP),
) -> None:
    """Run LongHorizon (operator:longhorizon: Manager, Executor and Auditor over Run / Execution / Audit resources)
    against a running loop-server, with leader election between replicas; it installs its CRDs at start.

    Ask it with: loopd chat --to operator:longhorizon "Create hello.txt containing hello world"."""
    settings = longhorizon_settings(
        max_rounds=max_rounds,
        manager_timeout=manager_timeout,
        executor_timeout=executor_timeout,
        auditor_timeout=auditor_timeout,
        human_timeout=human_timeout,
        run_timeout=run_timeout,
        retention_ttl=retention_ttl,
        workspace=workspace,
        target=target,
        concurrency=concurrency,
    )
    _run_standalone(
        longhorizon_program(settings),
        resolve_connection(server=server, token=token, data_dir=data_dir, kubeconfig=kubeconfig, namespace=namespace),
        operator_lease(lease_name, namespace, duration=lease_duration),
        _MetricsOptions(metrics_port, metrics_host),
    )


@dataclass(frozen=True)
class _MetricsOptions:
    port: int | None
    host: str


def _run_standalone(
    program: OperatorProgram, connection: OperatorConnection, lease: LeaderElection, metrics: _MetricsOptions
) -> None:
    console = cli_console()
    try:
        run_async(_standalone(program, connection, lease, console, metrics))
    except MetricsExposureError as exc:
        raise CliError(str(exc), exit_code=EXIT_USAGE) from None
    except Exception as exc:
        cause = _first_error(exc)
        error = describe_operator_error(cause, connection, program)
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
    program: OperatorProgram,
    connection: OperatorConnection,
    lease: LeaderElection,
    console: Console,
    options: _MetricsOptions,
) -> None:
    stop = asyncio.Event()
    abort = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            abort.set()
            return
        stop.set()
        console.print(
            f"stopping: {program.answering} in progress may finish (up to 30 s); press Ctrl-C again to stop at once"
        )

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal)

    def registered() -> None:
        console.print(
            f"[bold green]{program.title}[/] registered as {program.actor} at {connection.server_url}; lease "
            f"{lease.namespace}/{lease.lease_name} as {lease.identity} (pid {os.getpid()}, host {socket.gethostname()})"
            ". Ctrl-C stops.",
            markup=True,
        )
        settle_startup_heap()

    async with contextlib.AsyncExitStack() as stack:
        metrics: Metrics | None = None
        if options.port is not None:
            metrics = Metrics()
            token = os.environ.get(METRICS_TOKEN_ENV) or None
            url = await stack.enter_async_context(
                open_metrics_server(metrics, host=options.host, port=options.port, token=token)
            )
            console.print(f"metrics: {url}/metrics" + (" (bearer token: $" + METRICS_TOKEN_ENV + ")" if token else ""))
        await serve_operator(
            connection, program, stop=stop, abort=abort, lease=lease, on_registered=registered, metrics=metrics
        )
    console.print(f"{program.title} stopped")
