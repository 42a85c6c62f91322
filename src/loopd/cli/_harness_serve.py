"""`loopd harness serve`: the standard harness over HTTP/SSE until Ctrl-C."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from loopd.harness import HarnessError
from loopd.harness.gate import DEFAULT_POLICY, GatePolicy, GatePolicyError, load_policy
from loopd.harness.models import ModelConfig, PriceTableError
from loopd.harness.serve import InsecureBindError, RunningServer, check_bind, serve
from loopd.harness.standard import HarnessSettings, default_data_dir

harness_app = typer.Typer(
    name="harness",
    help="The built-in agent harness as a service.",
    no_args_is_help=True,
    add_completion=False,
)

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
    model: str | None = typer.Option(None, help="Model id, or 'demo' (default: $LOOPD_MODEL, else demo)."),
    policy: Path | None = typer.Option(None, help="Headless gate policy file (YAML or JSON)."),
    token: str | None = typer.Option(
        None,
        envvar="LOOPD_HARNESS_TOKEN",
        show_envvar=True,
        help="Bearer token clients must send (required off loopback).",
    ),
) -> None:
    """Serve sessions, inputs, gates and a resumable event stream over HTTP until Ctrl-C."""
    try:
        check_bind(host, token)
        gate_policy: GatePolicy = load_policy(policy) if policy is not None else DEFAULT_POLICY
        model_config = ModelConfig.from_env(model=model)
        model_config.price_table()  # fail now on a bad LOOPD_PRICES, not on the first model call
    except (InsecureBindError, GatePolicyError, PriceTableError, ValueError) as exc:
        typer.secho(f"loopd harness serve: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from exc
    settings = HarnessSettings(
        workspace=(workspace or Path.cwd()).expanduser().resolve(),
        data_dir=(data_dir or default_data_dir() / "harness").expanduser().resolve(),
        model=model_config,
        policy=gate_policy,
    )

    def ready(running: RunningServer) -> None:
        typer.echo(f"loopd harness serving on {running.url}  (OpenAPI: {running.url}/openapi.json)")
        typer.echo(f"  model: {model_config.model}")
        if model_config.is_demo:
            typer.echo(_REAL_MODEL_HINT)
        typer.echo(f"  workspace: {settings.workspace}")
        typer.echo(f"  journal: {settings.data_dir}")
        typer.echo("  auth: bearer token required" if token else "  auth: none (loopback only)")
        typer.echo("Press Ctrl-C to stop.")

    try:
        asyncio.run(serve(settings, host, port, token, on_ready=ready))
    except OSError as exc:
        typer.secho(f"loopd harness serve: cannot serve on {host}:{port}: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from exc
    except HarnessError as exc:
        typer.secho(f"loopd harness serve: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from exc
    typer.echo("loopd harness stopped.")
