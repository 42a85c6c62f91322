"""`loopd up`: the whole platform in one process, on the embedded default (SQLite in a data directory).

After the server is up, loopd's operators — the Router (`operator:router`) and LongHorizon (`operator:longhorizon`)
— run in the same process through `loopd.runtime`, each exactly as `loopd operator <key>` runs it (`OperatorProgram`
and `serve_operator` of `_operator`): over the server's HTTP API with a token of its own (minted once with the
server's `AccessStore` and kept in ``<data dir>/operators/<key>.token``), and Tasks, its resources and its Lease
through the embedded Kubernetes API with a kubeconfig — no private shortcut into the server. Its HTTP requests go
through the server's ASGI app in process (`loopd._infra.inprocess`: the same routes, credentials, validation and
middleware, without the socket round trip), its event streams over loopback. ``--no-router`` /
``--no-longhorizon`` leave one out. ``server.json`` (how clients find the server) is written once every operator
here has registered (or failed), so a client never asks an operator the server does not know yet. One that fails is
reported in one line and the server goes on without it. The demo model learns both operators' prompts
(`UpSettings.demo_rules`), with or without them here (a standalone one may ask it). Settings: the flags, then the
``LOOPD_*`` variables, then ``--config FILE`` (the same file as `loopd server`'s; its Tasks stay embedded here).
The server layer never imports operators or the runtime: this module composes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

import typer
from rich.console import Console

from loopd._infra.heap import settle_startup_heap
from loopd.cli._errors import (
    EXIT_USAGE,
    CliError,
    address_in_use,
    cli_console,
    require_free_ports,
    run_async,
)
from loopd.cli._sandbox_option import sandbox_option

if TYPE_CHECKING:
    import httpx

    from loopd.cli._operator import OperatorProgram
    from loopd.server import RunningServer, UpSettings

logger = logging.getLogger(__name__)

OPERATORS_DIR: Final = Path("operators")
"""Where the in-process operators' tokens are kept: ``<data dir>/operators/<key>.token`` (0600)."""
OPERATOR_DRAIN: Final = 5.0
"""Seconds the in-process operators' work in progress may take to finish when `loopd up` stops."""


def up_command(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="A configuration file (YAML; docs/configuration.md); also $LOOPD_CONFIG."
    ),
    data_dir: Path | None = typer.Option(
        None, "--data-dir", help="Where loopd keeps its state (default: $LOOPD_DATA_DIR, else ~/.local/share/loopd)."
    ),
    host: str | None = typer.Option(
        None, "--host", help="Address to listen on (the HTTP API and the resource API; default 127.0.0.1)."
    ),
    port: int | None = typer.Option(None, "--port", help="Port of the HTTP API and web page (default 8420; 0: any)."),
    api_port: int | None = typer.Option(
        None, "--api-port", help="Port of the Kubernetes-compatible API (default 0: any free port)."
    ),
    model: str | None = typer.Option(
        None, "--model", help="Model id or fallback chain A,B, each [openai:|anthropic:]ID (default: $LOOPD_MODEL)."
    ),
    base_url: str | None = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint ($OPENAI_BASE_URL)."),
    database: str | None = typer.Option(
        None, "--database", help="PostgreSQL DSN for the server state ($LOOPD_DATABASE_URL; default: SQLite)."
    ),
    public: bool | None = typer.Option(
        None,
        "--public",
        help="Allow a --host beyond loopback (both APIs): callers then need a token or a one-time sign-in link.",
    ),
    workspaces: Path | None = typer.Option(
        None,
        "--workspaces",
        help="Where the harnesses' workspaces live, outside the data directory (default: <data dir>-workspaces).",
    ),
    sandbox: str | None = sandbox_option(),
    no_router: bool = typer.Option(
        False,
        "--no-router",
        help="Do not run the Router (operator:router) in this process: run loopd operator router beside it, or "
        "questions to the Router wait.",
    ),
    no_longhorizon: bool = typer.Option(
        False,
        "--no-longhorizon",
        help="Do not run LongHorizon (operator:longhorizon) in this process: run loopd operator longhorizon beside "
        "it, or its questions wait. Its settings come from the LOOPD_LH_* variables (docs/longhorizon.md).",
    ),
    ledger_retention: str | None = typer.Option(
        None,
        "--ledger-retention",
        help="Keep the ledger's prompts and replies this long after a trail's last event, e.g. 30d "
        "($LOOPD_LEDGER_RETENTION; config ledger.retention; default: for good).",
    ),
) -> None:
    """Run loop-server: HTTP API, Kubernetes-compatible API, Harness Engine and the built-in `assistant` harness."""
    from loopd.cli._server import ConfigRefused, demo_rules, print_problems, read_config, server_settings
    from loopd.server import ExposureRefused, WorkspaceLocationError, check_exposure

    try:
        loaded = read_config(config)
    except ConfigRefused as exc:
        print_problems(exc)
        raise typer.Exit(EXIT_USAGE) from exc
    resolved_host = host or loaded.host or "127.0.0.1"
    try:
        check_exposure(resolved_host, public=bool(public or loaded.public))
    except ExposureRefused as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    console = cli_console()
    programs = _programs(router=not no_router, longhorizon=not no_longhorizon)
    settings = server_settings(
        loaded,
        data_dir=data_dir,
        host=host,
        port=port,
        api_port=api_port,
        public=public,
        database=database,
        workspaces=workspaces,
        model=model,
        base_url=base_url,
        sandbox=sandbox,
        demo_rules=demo_rules(),
        # With operators here, server.json (how clients find this server) is written once they have registered.
        announce=not programs,
        holder="loopd up",
        embedded_only=True,
        ledger_retention=ledger_retention,
    )
    ports = {"--port": settings.port, "--api-port": settings.api_port}
    require_free_ports(settings.host, ports)
    try:
        run_async(_up(settings, console, programs))
    except WorkspaceLocationError as exc:
        raise CliError(str(exc), "pass --workspaces DIR outside it", exit_code=EXIT_USAGE) from exc
    except OSError as exc:  # anything else (a busy data directory ...) goes to the app's one-line report
        busy = address_in_use(exc, settings.host, ports)
        if busy is None:
            raise
        raise busy from exc


def _programs(*, router: bool, longhorizon: bool) -> list[OperatorProgram]:
    """The operators to run here, their settings read now (from the environment): a bad one is a usage error."""
    from loopd.cli._operator import longhorizon_program, longhorizon_settings, router_program
    from loopd.operators.router import RouterSettings, RouterSettingsError

    programs: list[OperatorProgram] = []
    if router:
        try:
            programs.append(router_program(RouterSettings.from_env()))
        except RouterSettingsError as exc:
            raise CliError(str(exc), "fix it, or pass --no-router", exit_code=EXIT_USAGE) from exc
    if longhorizon:
        try:
            programs.append(longhorizon_program(longhorizon_settings()))
        except CliError as exc:
            raise CliError(exc.message, "fix it, or pass --no-longhorizon", exit_code=EXIT_USAGE) from exc
    return programs


_ROLES: Final = {
    "router": "plans, asks the assistant, answers",
    "longhorizon": "Manager, Executor and Auditor over Runs, in rounds",
}


async def _up(settings: UpSettings, console: Console, programs: list[OperatorProgram]) -> None:
    from loopd.cli._server import paced_collections
    from loopd.server import open_loop_server

    stop = asyncio.Event()
    abort = asyncio.Event()  # a second Ctrl-C: the operators stop without waiting for their work in progress

    def on_signal() -> None:
        (abort if stop.is_set() else stop).set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal)
    status = console.status("starting loopd…")
    status.start()
    try:
        async with open_loop_server(settings) as server:
            status.stop()
            console.print(f"[bold green]loopd is up[/] at {server.url}")
            console.print(f"  web page + HTTP API   {server.url}   (API explorer: {server.url}/docs)")
            console.print(
                f"  Kubernetes API        {server.api_url}   (kubectl: loopd kubeconfig --data-dir {server.data_dir})"
            )
            console.print(f"  token                 {server.token_file}")
            if settings.public:
                console.print(
                    f"  exposed (--public)    on {settings.host}: callers need a token; a browser on another "
                    f"machine signs in with a link from `loopd signin-link --data-dir {server.data_dir}`",
                    markup=False,
                )
            console.print(f"  data                  {server.data_dir}")
            console.print(f"  assistant workspace   {server.workspace}")
            console.print(f"  {server.sandbox.describe()}", markup=False)
            if server.model.is_demo:
                console.print(
                    "  model                 demo: a scripted stand-in, no LLM. For a real model set LOOPD_MODEL "
                    "(e.g. gpt-4o-mini) and OPENAI_API_KEY, plus OPENAI_BASE_URL for another OpenAI-compatible "
                    "provider, or pass --model / --base-url."
                )
            else:
                console.print(f"  model                 {server.model.model}")
            running = {program.key for program in programs}
            for key, role in _ROLES.items():
                if key in running:
                    console.print(f"  {key:<21} operator:{key}, in this process ({role})")
                else:
                    console.print(f"  {key:<21} off (--no-{key}): questions to operator:{key} wait for one")
            if "router" in running:
                console.print('Try it: [bold]loopd chat "hello"[/] in another terminal. Ctrl-C stops.')
            else:
                console.print('Try it: [bold]loopd chat --to harness:assistant "hello"[/] in another terminal.')
            if "longhorizon" in running:
                console.print(
                    '        [bold]loopd chat --to operator:longhorizon "Create hello.txt containing hello world"[/]'
                )
            settle_startup_heap()  # the server is ready (the operators' starts are frozen once they are too)
            with paced_collections(server):
                if programs:
                    await _serve_operators(server, programs, stop, abort, console)
                else:
                    await stop.wait()
            console.print("stopping…")
    finally:
        status.stop()


async def _serve_operators(
    server: RunningServer, programs: list[OperatorProgram], stop: asyncio.Event, abort: asyncio.Event, console: Console
) -> None:
    """Run every operator of ``programs`` beside the server until ``stop``, each on its own (one that fails is
    reported and the others and the server go on). ``server.json`` is written once each has registered or failed."""
    waiting = {program.key for program in programs}

    def ready(key: str) -> None:
        waiting.discard(key)
        if not waiting:
            server.announce()
            settle_startup_heap()  # every operator has started: what they built stays as long as they do

    async with asyncio.TaskGroup() as group:
        for program in programs:
            group.create_task(
                _serve_in_process(server, program, stop, abort, console, ready=functools.partial(ready, program.key)),
                name=f"loopd-up-{program.key}",
            )


async def _serve_in_process(
    server: RunningServer,
    program: OperatorProgram,
    stop: asyncio.Event,
    abort: asyncio.Event,
    console: Console,
    *,
    ready: Callable[[], None],
) -> None:
    """Run one operator until ``stop``; one that fails is reported and the server keeps serving without it.

    On stop its work in progress gets a few seconds (`OPERATOR_DRAIN`): its harness calls run in this server and
    are journaled, so the operator of the next start re-attaches to them."""
    from loopd.cli._operator import (
        OperatorConnection,
        describe_operator_error,
        kubeconfig_for,
        loopback_url,
        operator_lease,
        serve_operator,
    )

    connection: OperatorConnection | None = None
    try:
        token = await _operator_token(server, program.key)
        url = loopback_url(server.url)
        connection = OperatorConnection(url, token, kubeconfig_for(server.data_dir, token))
        # One `loopd up` per data directory: a stable identity takes its own Lease back at once after a restart.
        lease = operator_lease(program.lease_name, connection.namespace, identity=f"loopd-up:{server.data_dir}")
        await serve_operator(
            connection,
            program,
            stop=stop,
            abort=abort,
            drain=OPERATOR_DRAIN,
            lease=lease,
            on_registered=ready,
            metrics=server.metrics,  # its reconciles show in the server's /metrics
            transport=_in_process(server),
        )
    except Exception as exc:  # the server goes on; the operator's failure is said once, in one line
        from loopd.cli._errors import describe

        ready()  # serve without it
        error = (describe_operator_error(exc, connection, program) if connection is not None else None) or describe(exc)
        logger.error("the %s stopped", program.title, exc_info=True)
        console.print(f"[red]the {program.title} stopped:[/] {error.line()}", markup=True)
        await stop.wait()


def _in_process(server: RunningServer) -> httpx.AsyncBaseTransport | None:
    """The operators' way to the server beside them: its own ASGI app, in process (same routes, credentials and
    middleware; no socket), event streams over loopback."""
    if server.app is None:
        return None
    import httpx

    from loopd._infra.inprocess import InProcessTransport

    return InProcessTransport(server.app, fallback=httpx.AsyncHTTPTransport())


async def _operator_token(server: RunningServer, key: str) -> str:
    """The in-process operator's token for ``operator:<key>``: the one kept in the data directory
    (``operators/<key>.token``) while the server still accepts it, else a new one (minted with the `AccessStore` that
    `loopd token create` uses, and kept)."""
    from loopd.server.http import AccessStore, Identity

    path = server.data_dir / OPERATORS_DIR / f"{key}.token"
    access = AccessStore(server.db)
    actor = Identity("operator", key)
    with contextlib.suppress(OSError):
        kept = path.read_text().strip()
        if kept and await access.token_actor(kept) == actor:
            return kept
    token = await access.create_token(actor)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    os.replace(tmp, path)
    return token
