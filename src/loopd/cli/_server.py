"""`loopd server` (the loop-server alone) and `loopd config check`, and the settings both it and `loopd up` build.

`loopd server` runs what `loopd up` runs minus the operators: the HTTP API and web UI, the Harness Engine, the
harness targets of the configuration file (or the built-in ``assistant``), and the responder that answers Tasks for
harnesses. Tasks go through a Kubernetes API: ``--kubeconfig FILE``, the pod's own cluster (in-cluster), or the
embedded store and its Kubernetes-compatible API (the default; in PostgreSQL with ``--database postgresql://…``,
so replicas share Tasks). Operators run beside it as `loopd operator <key>` processes.

Settings come from, strongest first: the flags, the ``LOOPD_*`` environment variables, the configuration file
(``--config FILE`` or ``LOOPD_CONFIG``), the defaults (`server_settings`). A configuration that does not validate
is reported one problem per line (``file:line:col: path: message``) with exit code 2, before anything starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import typer
from rich.console import Console

from loopd._infra.heap import CollectorPacer, settle_startup_heap
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
    from loopd.server import KubeApiMode, RunningServer, UpSettings
    from loopd.server.config import ServerConfig

DEFAULT_HOST: Final = "127.0.0.1"
_CONFIG_HELP: Final = "A configuration file (YAML; docs/configuration.md); also $LOOPD_CONFIG."


class ConfigRefused(CliError):
    """A configuration that does not validate: ``lines`` are its problems, one per line (exit 2)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(lines[0] if len(lines) == 1 else f"{len(lines)} problems in the configuration")
        self.lines = lines
        self.exit_code = EXIT_USAGE


def print_problems(error: ConfigRefused) -> None:
    """Write each of the configuration's problems on its own line to stderr."""
    for line in error.lines:
        sys.stderr.write(f"{line}\n")
    sys.stderr.flush()


def read_config(
    path: Path | None, *, env: Mapping[str, str] | None = None, resolve_secrets: bool = True
) -> ServerConfig:
    """The configuration of ``path`` (else ``$LOOPD_CONFIG``, else none) with the environment's overrides;
    `ConfigRefused` lists its problems."""
    from loopd.server.config import CONFIG_ENV, ConfigError, config_from_env, load_config

    source = os.environ if env is None else env
    chosen = path if path is not None else (Path(source[CONFIG_ENV]) if source.get(CONFIG_ENV) else None)
    try:
        if chosen is None:
            return config_from_env(env=source, resolve_secrets=resolve_secrets)
        return load_config(chosen, env=source, resolve_secrets=resolve_secrets)
    except ConfigError as exc:
        raise ConfigRefused(exc.lines()) from exc


def server_settings(
    config: ServerConfig,
    *,
    data_dir: Path | None = None,
    host: str | None = None,
    port: int | None = None,
    api_port: int | None = None,
    public: bool | None = None,
    database: str | None = None,
    kubeconfig: Path | None = None,
    kube_api: str | None = None,
    namespace: str | None = None,
    workspaces: Path | None = None,
    model: str | None = None,
    base_url: str | None = None,
    sandbox: str | None = None,
    demo_rules: tuple[DemoRule, ...] = (),
    announce: bool = True,
    holder: str = "loopd server",
    embedded_only: bool = False,
    ledger_retention: str | None = None,
) -> UpSettings:
    """The server's settings: each flag given wins over ``config`` (the file with the environment over it), which
    wins over the defaults. ``embedded_only`` (`loopd up`): Tasks must live in the embedded store."""
    from loopd.server import DEFAULT_PORT, ServerSetupError, UpSettings, resolve_kube_api, resolve_namespace
    from loopd.server.config import MissingSecret

    chosen_kubeconfig = kubeconfig.expanduser() if kubeconfig is not None else config.kubeconfig
    requested = kube_api or ("kubeconfig" if kubeconfig is not None else config.kube_api)
    if embedded_only:
        if requested not in ("auto", "embedded") or kubeconfig is not None:
            raise CliError(
                f"loopd up keeps its Tasks in the embedded store (kubernetes.api is {requested})",
                "run `loopd server` (and `loopd operator <key>`) to use a Kubernetes cluster",
                exit_code=EXIT_USAGE,
            )
        mode: KubeApiMode = "embedded"
    else:
        try:
            mode = resolve_kube_api(requested, chosen_kubeconfig)
        except ServerSetupError as exc:
            raise CliError(str(exc), exit_code=EXIT_USAGE) from exc
    extra: dict[str, Any] = {}
    if config.harness_calls is not None:
        extra["engine_capacity"] = config.harness_calls
    if config.call_timeout is not None:
        extra["call_timeout"] = config.call_timeout
    if config.lease_ttl is not None:
        extra["lease_ttl"] = config.lease_ttl
    extra["ledger_retention"] = config.ledger_retention
    if ledger_retention is not None:
        from loopd.server.ledger import parse_duration
        from loopd.server.storage import InvalidRecord

        try:
            extra["ledger_retention"] = parse_duration(ledger_retention)
        except InvalidRecord as exc:
            raise CliError(f"--ledger-retention: {exc}", exit_code=EXIT_USAGE) from exc
    try:
        actor_tokens = tuple((item.actor, item.token()) for item in config.actor_tokens)
    except MissingSecret as exc:
        raise CliError(str(exc), exit_code=EXIT_USAGE) from exc
    chosen_workspaces = workspaces if workspaces is not None else config.workspaces
    return UpSettings(
        data_dir=(data_dir or config.data_dir or default_data_dir()).expanduser(),
        host=host or config.host or DEFAULT_HOST,
        port=_first(port, config.port, DEFAULT_PORT),
        api_port=_first(api_port, config.api_port, 0),
        model=model_config(model, base_url),
        database_url=database or config.database_url,
        public=bool(public or config.public),
        workspaces=chosen_workspaces.expanduser() if chosen_workspaces is not None else None,
        sandbox=sandbox_for(sandbox),
        demo_rules=demo_rules,
        announce=announce,
        harnesses=config.harnesses,
        kube_api=mode,
        kubeconfig=chosen_kubeconfig if mode == "kubeconfig" else None,
        namespace=resolve_namespace(namespace or config.namespace, mode),
        kube_timeout=config.kube_timeout,
        task_workers=config.task_workers,
        admin_tokens=(config.admin_token.get_secret_value(),) if config.admin_token is not None else (),
        actor_tokens=actor_tokens,
        holder=holder,
        ledger_prompts=config.ledger_prompts,
        ledger_redact=config.ledger_redact,
        **extra,
    )


def ledger_retention_option() -> Any:
    """``--ledger-retention``: how long the ledger keeps full prompts and replies."""
    return typer.Option(
        None,
        "--ledger-retention",
        help="Keep the ledger's prompts and replies this long after a trail's last event, e.g. 30d "
        "($LOOPD_LEDGER_RETENTION; config ledger.retention; default: for good).",
    )


def _first(*values: int | None) -> int:
    for value in values:
        if value is not None:
            return value
    return 0


def server_command(
    config: Path | None = typer.Option(None, "--config", "-c", help=_CONFIG_HELP),
    data_dir: Path | None = typer.Option(
        None,
        "--data-dir",
        help="Where this server keeps its local state (default: $LOOPD_DATA_DIR, else ~/.local/share/loopd).",
    ),
    host: str | None = typer.Option(None, "--host", help="Address to listen on (default 127.0.0.1; $LOOPD_HOST)."),
    port: int | None = typer.Option(None, "--port", help="Port of the HTTP API and web page (default 8420; 0: any)."),
    api_port: int | None = typer.Option(
        None, "--api-port", help="Port of the embedded Kubernetes-compatible API (default 0: any free port)."
    ),
    public: bool | None = typer.Option(
        None, "--public", help="Allow a --host beyond loopback: callers then need a token or a sign-in link."
    ),
    database: str | None = typer.Option(
        None, "--database", help="PostgreSQL DSN for the server state and the embedded Tasks ($LOOPD_DATABASE_URL)."
    ),
    kubeconfig: Path | None = typer.Option(
        None, "--kubeconfig", help="Keep Tasks on the cluster of this kubeconfig (its CRDs installed first)."
    ),
    kube_api: str | None = typer.Option(
        None,
        "--kube-api",
        help="Where Tasks live: auto (default), embedded, in-cluster (this pod's cluster) or kubeconfig.",
    ),
    namespace: str | None = typer.Option(
        None, "--namespace", "-n", help="Namespace of the Tasks (default: the pod's own in-cluster, else default)."
    ),
    workspaces: Path | None = typer.Option(
        None, "--workspaces", help="Where the built-in harnesses' workspaces live, outside the data directory."
    ),
    model: str | None = typer.Option(
        None, "--model", help="Model or fallback chain A,B of the default assistant ($LOOPD_MODEL, else demo)."
    ),
    base_url: str | None = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint ($OPENAI_BASE_URL)."),
    sandbox: str | None = sandbox_option(),
    ledger_retention: str | None = ledger_retention_option(),
) -> None:
    """Run loop-server alone (HTTP API, web UI, Harness Engine, harness targets): no operators in this process."""
    from loopd.server import ExposureRefused, WorkspaceLocationError, check_exposure

    try:
        loaded = read_config(config)
    except ConfigRefused as exc:
        print_problems(exc)
        raise typer.Exit(EXIT_USAGE) from exc
    settings = server_settings(
        loaded,
        data_dir=data_dir,
        host=host,
        port=port,
        api_port=api_port,
        public=public,
        database=database,
        kubeconfig=kubeconfig,
        kube_api=kube_api,
        namespace=namespace,
        workspaces=workspaces,
        model=model,
        base_url=base_url,
        sandbox=sandbox,
        demo_rules=demo_rules(),
        ledger_retention=ledger_retention,
    )
    try:
        check_exposure(settings.host, public=settings.public)
    except ExposureRefused as exc:
        raise CliError(str(exc), exit_code=EXIT_USAGE) from exc
    ports = {"--port": settings.port, "--api-port": settings.api_port if settings.kube_api == "embedded" else 0}
    require_free_ports(settings.host, ports)
    try:
        run_async(_serve(settings, cli_console()))
    except WorkspaceLocationError as exc:
        raise CliError(str(exc), "pass --workspaces DIR outside it", exit_code=EXIT_USAGE) from exc
    except OSError as exc:
        busy = address_in_use(exc, settings.host, ports)
        if busy is None:
            raise
        raise busy from exc


def demo_rules() -> tuple[DemoRule, ...]:
    """The demo model's answers to the Router's and LongHorizon's prompts, so standalone operators beside this
    server get sensible demo answers. Each operator's rules recognise only its own prompts, by their header lines."""
    from loopd.operators.longhorizon import demo_rules as longhorizon_rules
    from loopd.operators.router import demo_rules as router_rules

    return (*router_rules(), *longhorizon_rules())


@contextlib.contextmanager
def paced_collections(server: RunningServer) -> Iterator[CollectorPacer | None]:
    """For the block: the cyclic collector's automatic runs wait while ``server`` has answers in flight, bounded
    (`loopd._infra.heap.CollectorPacer`) — a serving command's process-wide choice, like `settle_startup_heap`.
    None when the server keeps no open answers."""
    answers = server.chat.answers
    if answers is None:
        yield None
        return
    pacer = CollectorPacer()
    remove = answers.add_listener(pacer.busy)
    try:
        yield pacer
    finally:
        remove()
        pacer.release()


async def _serve(settings: UpSettings, console: Console) -> None:
    from loopd.server import ServerSetupError, open_loop_server

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        async with open_loop_server(settings) as server:
            console.print(f"[bold green]loopd server is up[/] at {server.url}")
            console.print(f"  web page + HTTP API   {server.url}   (health: /healthz, readiness: /readyz)")
            if server.api_url is not None:
                store = "PostgreSQL" if settings.database_url else "SQLite"
                console.print(f"  Kubernetes API        {server.api_url}   (embedded, Tasks in {store})")
            else:
                where = settings.kubeconfig if settings.kube_api == "kubeconfig" else "this pod's cluster"
                console.print(f"  Kubernetes API        {where}   (namespace {settings.namespace})", markup=False)
            console.print(f"  token                 {server.token_file}")
            console.print(f"  data                  {server.data_dir}")
            console.print(f"  database              {'PostgreSQL' if settings.database_url else 'SQLite'}")
            for actor in server.harnesses:
                console.print(f"  harness:{actor.key:<13} {actor.display_name}", markup=False)
            console.print("  operators             none here: run `loopd operator router` (and others) beside it")
            settle_startup_heap()
            with paced_collections(server):
                await stop.wait()
            console.print("stopping…")
    except ServerSetupError as exc:
        raise CliError(str(exc), exit_code=EXIT_USAGE) from exc


# --- loopd config --------------------------------------------------------------------------------------------

config_app = typer.Typer(help="The server's configuration file.", no_args_is_help=True)


@config_app.command("check")
def config_check_command(
    file: Path = typer.Argument(..., help="The configuration file to validate."),
) -> None:
    """Validate FILE against the configuration schema (and the environment's LOOPD_* overrides): each problem on its
    own line as FILE:LINE:COL: key: message, exit 2; nothing wrong: 'FILE: ok', exit 0."""
    try:
        loaded = read_config(file, resolve_secrets=False)
    except ConfigRefused as exc:
        print_problems(exc)
        raise typer.Exit(EXIT_USAGE) from exc
    count = "the default harness" if loaded.harnesses is None else f"{len(loaded.harnesses)} harness target(s)"
    typer.echo(f"{file}: ok ({count})")
