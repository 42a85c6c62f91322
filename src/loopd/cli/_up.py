"""`loopd up`: the whole platform in one process, on the embedded default (SQLite in a data directory).

After the server is up, the Router (`operator:router`) runs in the same process through `loopd.runtime`, exactly as
`loopd operator router` runs it: over the server's HTTP API on loopback with a token of its own (minted once with the
server's `AccessStore` and kept in ``<data dir>/operators/router.token``), and Tasks and its Lease through the
embedded Kubernetes API with a kubeconfig — no private shortcut into the server. ``--no-router`` leaves it out.
The server layer never imports operators or the runtime: this module composes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Final

import typer
from rich.console import Console

from loopd._paths import default_data_dir
from loopd.cli._errors import (
    EXIT_USAGE,
    CliError,
    address_in_use,
    cli_console,
    model_config,
    require_free_ports,
    run_async,
)
from loopd.cli._sandbox_option import sandbox_for, sandbox_option

if TYPE_CHECKING:
    from loopd.harness.models import DemoRule
    from loopd.operators.router import RouterSettings
    from loopd.server import RunningServer, UpSettings

logger = logging.getLogger(__name__)

ROUTER_TOKEN_FILE: Final = Path("operators") / "router.token"
ROUTER_DRAIN: Final = 5.0
"""Seconds the in-process Router's answers in progress may take to finish when `loopd up` stops."""


def up_command(
    data_dir: Path | None = typer.Option(
        None, "--data-dir", help="Where loopd keeps its state (default: $LOOPD_DATA_DIR, else ~/.local/share/loopd)."
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (the HTTP API and the resource API)."),
    port: int = typer.Option(8420, "--port", help="Port of the HTTP API and web page (0: any free port)."),
    api_port: int = typer.Option(0, "--api-port", help="Port of the Kubernetes-compatible API (0: any free port)."),
    model: str | None = typer.Option(None, "--model", help="Model id (default: $LOOPD_MODEL, else the demo model)."),
    base_url: str | None = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint ($OPENAI_BASE_URL)."),
    database: str | None = typer.Option(
        None, "--database", envvar="LOOPD_DATABASE_URL", help="PostgreSQL DSN for the server state (default: SQLite)."
    ),
    public: bool = typer.Option(
        False,
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
) -> None:
    """Run loop-server: HTTP API, Kubernetes-compatible API, Harness Engine and the built-in `assistant` harness."""
    from loopd.server import ExposureRefused, check_exposure

    try:
        check_exposure(host, public=public)
    except ExposureRefused as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    console = cli_console()
    config = model_config(model, base_url)
    confinement = sandbox_for(sandbox)
    from loopd.server import UpSettings, WorkspaceLocationError

    settings = UpSettings(
        data_dir=(data_dir or default_data_dir()).expanduser(),
        host=host,
        port=port,
        api_port=api_port,
        model=config,
        database_url=database,
        public=public,
        workspaces=workspaces.expanduser() if workspaces is not None else None,
        sandbox=confinement,
        demo_rules=_demo_rules(),
        # With the Router here, server.json (how clients find this server) is written once it has registered.
        announce=no_router,
    )
    router = None if no_router else _router_settings()
    require_free_ports(host, {"--port": port, "--api-port": api_port})
    try:
        run_async(_up(settings, console, router))
    except WorkspaceLocationError as exc:
        raise CliError(str(exc), "pass --workspaces DIR outside it", exit_code=EXIT_USAGE) from exc
    except OSError as exc:  # anything else (a busy data directory ...) goes to the app's one-line report
        busy = address_in_use(exc, host, {"--port": port, "--api-port": api_port})
        if busy is None:
            raise
        raise busy from exc


def _demo_rules() -> tuple[DemoRule, ...]:
    """The Router's answers for the demo model (with or without the Router here: a standalone one may ask it)."""
    from loopd.operators.router import demo_rules

    return tuple(demo_rules())


def _router_settings() -> RouterSettings:
    from loopd.operators.router import RouterSettings, RouterSettingsError

    try:
        return RouterSettings.from_env()
    except RouterSettingsError as exc:
        raise CliError(str(exc), "fix it, or pass --no-router", exit_code=EXIT_USAGE) from exc


async def _up(settings: UpSettings, console: Console, router: RouterSettings | None) -> None:
    from loopd.server import open_loop_server

    stop = asyncio.Event()
    abort = asyncio.Event()  # a second Ctrl-C: the Router stops without waiting for its answers in progress

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
            if router is None:
                console.print("  router                off (--no-router): questions to operator:router wait for one")
                console.print('Try it: [bold]loopd chat --to harness:assistant "hello"[/] in another terminal.')
                await stop.wait()
            else:
                console.print(
                    "  router                operator:router, in this process (plans, asks the assistant, answers)"
                )
                console.print('Try it: [bold]loopd chat "hello"[/] in another terminal. Ctrl-C stops.')
                await _serve_with_router(server, router, stop, abort, console)
            console.print("stopping…")
    finally:
        status.stop()


async def _serve_with_router(
    server: RunningServer, settings: RouterSettings, stop: asyncio.Event, abort: asyncio.Event, console: Console
) -> None:
    """Run the Router until ``stop``; a Router that fails is reported and the server keeps serving without it.

    On stop its answers in progress get a few seconds (`ROUTER_DRAIN`): their harness calls run in this server and
    are journaled, so the Router of the next start re-attaches to them."""
    from loopd.cli._operator import (
        ROUTER_KEY,
        RouterConnection,
        kubeconfig_for,
        loopback_url,
        router_lease,
        serve_router,
    )

    connection: RouterConnection | None = None
    try:
        token = await _router_token(server)
        url = loopback_url(server.url)
        connection = RouterConnection(url, token, kubeconfig_for(server.data_dir, token))
        # One `loopd up` per data directory: a stable identity takes its own Lease back at once after a restart.
        lease = router_lease(ROUTER_KEY, connection.namespace, identity=f"loopd-up:{server.data_dir}")
        # Clients find the server (server.json) only once the Router is registered: a `loopd chat` right after
        # start-up is never refused for an unknown operator:router.
        await serve_router(
            connection,
            settings,
            stop=stop,
            abort=abort,
            drain=ROUTER_DRAIN,
            lease=lease,
            on_registered=server.announce,
        )
    except Exception as exc:  # the server goes on; the Router's failure is said once, in one line
        from loopd.cli._errors import describe
        from loopd.cli._operator import describe_router_error

        server.announce()  # serve without the Router
        error = (describe_router_error(exc, connection) if connection is not None else None) or describe(exc)
        logger.error("the Router stopped", exc_info=True)
        console.print(f"[red]the Router stopped:[/] {error.line()}", markup=True)
        await stop.wait()


async def _router_token(server: RunningServer) -> str:
    """The in-process Router's token for `operator:router`: the one kept in the data directory while the server
    still accepts it, else a new one (minted with the `AccessStore` that `loopd token create` uses, and kept)."""
    from loopd.server.http import AccessStore, Identity

    path = server.data_dir / ROUTER_TOKEN_FILE
    access = AccessStore(server.db)
    actor = Identity("operator", "router")
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
