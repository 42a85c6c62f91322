"""`loopd up`: the whole platform in one process, on the embedded default (SQLite in a data directory)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from loopd._paths import default_data_dir
from loopd.cli._errors import EXIT_USAGE, CliError, address_in_use, cli_console, model_config, require_free_ports
from loopd.cli._sandbox_option import sandbox_for, sandbox_option

if TYPE_CHECKING:
    from loopd.server import UpSettings


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
    )
    require_free_ports(host, {"--port": port, "--api-port": api_port})
    try:
        asyncio.run(_up(settings, console))
    except WorkspaceLocationError as exc:
        raise CliError(str(exc), "pass --workspaces DIR outside it", exit_code=EXIT_USAGE) from exc
    except OSError as exc:  # anything else (a busy data directory ...) goes to the app's one-line report
        busy = address_in_use(exc, host, {"--port": port, "--api-port": api_port})
        if busy is None:
            raise
        raise busy from exc


async def _up(settings: UpSettings, console: Console) -> None:
    from loopd.server import open_loop_server

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
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
            console.print('Try it: [bold]loopd chat "hello"[/] in another terminal. Ctrl-C stops.')
            await stop.wait()
            console.print("stopping…")
    finally:
        status.stop()
