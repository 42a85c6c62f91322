"""`loopd harness serve`: the standard harness over HTTP/SSE until Ctrl-C."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Final

import typer

from loopd._infra.heap import settle_startup_heap
from loopd._infra.locking import data_dir_lock
from loopd._infra.serving import RunningServer
from loopd._paths import ensure_private_dir, ensure_private_file
from loopd.cli._errors import EXIT_USAGE, CliError, address_in_use, require_free_ports, run_async
from loopd.cli._errors import model_config as checked_model_config
from loopd.cli._sandbox_option import sandbox_for, sandbox_option
from loopd.harness import HarnessError
from loopd.harness.foreign import ENGINE_KEYS, ForeignEngine, ForeignKind, standard_engine
from loopd.harness.gate import DEFAULT_POLICY, GatePolicy, GatePolicyError, load_policy
from loopd.harness.models import ModelConfig
from loopd.harness.serve import IDEMPOTENCY_FILE, InsecureBindError, check_bind, serve
from loopd.harness.snapshots import SNAPSHOT_TRIGGERS
from loopd.harness.standard import STANDARD_MODES, HarnessSettings, default_data_dir
from loopd.harness.tools import ASK_TIMEOUT_DEFAULT

harness_app = typer.Typer(
    name="harness",
    help="The built-in agent harness as a service.",
    no_args_is_help=True,
    add_completion=False,
)

LOCK_FILE: Final = "serve.lock"
_REAL_MODEL_HINT = (
    "  This is the scripted demo model (no LLM). For a real one set LOOPD_MODEL (e.g. gpt-4o-mini) and "
    "OPENAI_API_KEY, plus OPENAI_BASE_URL for another OpenAI-compatible provider, or pass --model."
)


@harness_app.command("serve")
def serve_command(
    host: str = typer.Option("127.0.0.1", help="Address to bind. A non-loopback address requires --token."),
    port: int = typer.Option(8765, min=0, max=65535, help="Port to bind (0 picks a free one)."),
    workspace: Path | None = typer.Option(None, help="The directory the tools work in (default: the current one)."),
    data_dir: Path | None = typer.Option(
        None, help="Where the journal and idempotency keys live (default: <loopd data dir>/harness)."
    ),
    model: str | None = typer.Option(
        None, help="Model id, fallback chain A,B ([openai:|anthropic:]ID), or 'demo' (default: $LOOPD_MODEL)."
    ),
    policy: Path | None = typer.Option(None, help="Headless gate policy file (YAML or JSON)."),
    token: str | None = typer.Option(
        None,
        envvar="LOOPD_HARNESS_TOKEN",
        show_envvar=True,
        help="Bearer token clients must send (required off loopback).",
    ),
    sandbox: str | None = sandbox_option(),
    mode: str | None = typer.Option(
        None, "--mode", metavar="plan|build", help="The mode new sessions start in (default: build; plan: read-only)."
    ),
    engine: str | None = typer.Option(
        None,
        "--engine",
        metavar="claude|codex",
        help="Hand each turn to that coding-agent CLI (a foreign loop: its permission requests open gates).",
    ),
    engine_command: str | None = typer.Option(
        None, "--engine-command", help="The engine's command line: its path and flags of yours (default: the name)."
    ),
    session_workspaces: bool = typer.Option(
        False,
        "--session-workspaces",
        help="Give each session its own directory under --workspace (<workspace>/<session id>, created 0700).",
    ),
    snapshots: str = typer.Option(
        "off",
        "--snapshots",
        metavar="turn_done|step_done|idle|off",
        help="Snapshot each session's workspace (what a fork with workspace new/overwrite restores).",
    ),
) -> None:
    """Serve sessions, inputs, gates and a resumable event stream over HTTP until Ctrl-C."""
    modes = [m.name for m in STANDARD_MODES]
    if mode is not None and mode not in modes:
        raise CliError(f"loopd harness serve: --mode {mode!r}: use one of {', '.join(modes)}", exit_code=EXIT_USAGE)
    try:
        check_bind(host, token)
        gate_policy: GatePolicy = load_policy(policy) if policy is not None else DEFAULT_POLICY
    except (InsecureBindError, GatePolicyError) as exc:
        raise CliError(f"loopd harness serve: {exc}", exit_code=EXIT_USAGE) from exc
    if snapshots not in SNAPSHOT_TRIGGERS:
        raise CliError(
            f"loopd harness serve: --snapshots {snapshots!r}: use one of {', '.join(SNAPSHOT_TRIGGERS)}",
            exit_code=EXIT_USAGE,
        )
    root = (workspace or Path.cwd()).expanduser().resolve()
    journal_dir = (data_dir or default_data_dir() / "harness").expanduser().resolve()
    if session_workspaces and (root.is_relative_to(journal_dir) or root.is_relative_to(default_data_dir().resolve())):
        raise CliError(
            f"loopd harness serve: --session-workspaces: the workspace root {root} is inside a data directory",
            "pick a --workspace outside it (the journal and credentials live there)",
            exit_code=EXIT_USAGE,
        )
    foreign = _foreign_engine(engine, engine_command, model, mode, root)
    # A foreign CLI brings its own model (only its tokens are priced); a built-in model fails now on a bad key.
    model_config = ModelConfig.prices_only() if foreign is not None else checked_model_config(model)
    confinement = sandbox_for(sandbox)
    settings = HarnessSettings(
        workspace=root,
        data_dir=journal_dir,
        model=model_config,
        policy=gate_policy,
        sandbox=confinement,
        ask_user_timeout=ASK_TIMEOUT_DEFAULT,  # answered at POST /v1/sessions/{id}/questions/{request_id}
        mode=mode,
        foreign=foreign,
        snapshots=snapshots,  # type: ignore[arg-type]  # one of SNAPSHOT_TRIGGERS (checked above)
    )

    def ready(running: RunningServer) -> None:
        typer.echo(f"loopd harness serving on {running.url}  (OpenAPI: {running.url}/openapi.json)")
        if foreign is not None:
            typer.echo(f"  engine: {foreign.kind} ({' '.join(foreign.argv(None)[:1])}; it applies its own sandbox)")
        else:
            typer.echo(f"  model: {model_config.model}")
        if model_config.is_demo and foreign is None:
            typer.echo(_REAL_MODEL_HINT)
        if session_workspaces:
            typer.echo(f"  workspaces: {settings.workspace}/<session id> (one per session)")
        else:
            typer.echo(f"  workspace: {settings.workspace}")
        if snapshots != "off":
            typer.echo(f"  snapshots: on {snapshots} (forks may restore them)")
        typer.echo(f"  journal: {settings.data_dir}")
        if foreign is None:
            typer.echo(f"  {confinement.describe()}", err=True)
        typer.echo("  auth: bearer token required" if token else "  auth: none (loopback only)")
        typer.echo("Press Ctrl-C to stop.")
        settle_startup_heap()

    require_free_ports(host, {"--port": port})
    ensure_private_dir(settings.data_dir)  # transcripts hold file contents: 0700 / 0600, like `loopd up`
    try:
        # One server per data directory: a second one would take over (and fault) the first one's sessions.
        with data_dir_lock(settings.data_dir, LOCK_FILE, holder="loopd harness serve"):
            ensure_private_file(settings.data_dir / IDEMPOTENCY_FILE)
            run_async(serve(settings, host, port, token, on_ready=ready, session_workspaces=session_workspaces))
    except OSError as exc:
        busy = address_in_use(exc, host, {"--port": port})
        if busy is not None:
            raise busy from exc
        raise CliError(f"loopd harness serve: cannot serve on {host}:{port}: {exc}") from exc
    except HarnessError as exc:
        raise CliError(f"loopd harness serve: {exc}") from exc
    typer.echo("loopd harness stopped.")


def _foreign_engine(
    engine: str | None, command: str | None, model: str | None, mode: str | None, workspace: Path
) -> ForeignEngine | None:
    """``--engine`` / ``--engine-command`` (`CliError` for an unknown engine or a flag that does not apply)."""
    if engine is None:
        if command is not None:
            raise CliError("loopd harness serve: --engine-command needs --engine claude|codex", exit_code=EXIT_USAGE)
        return None
    if engine not in ENGINE_KEYS:
        raise CliError(f"loopd harness serve: --engine {engine!r}: use claude or codex", exit_code=EXIT_USAGE)
    if model is not None or mode is not None:
        raise CliError(
            "loopd harness serve: --model and --mode do not apply to --engine",
            "configure the CLI's own model (e.g. in --engine-command)",
            exit_code=EXIT_USAGE,
        )
    try:
        argv = tuple(shlex.split(command)) if command else ()
    except ValueError as exc:
        raise CliError(f"loopd harness serve: --engine-command: {exc}", exit_code=EXIT_USAGE) from exc
    kind: ForeignKind = "claude" if engine == "claude" else "codex"
    return standard_engine(kind, argv, workspace)
