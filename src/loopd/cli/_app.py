"""The `loopd` command line."""

from __future__ import annotations

import typer

from loopd import __version__
from loopd.cli._chat import chat_command
from loopd.cli._demo import demo_command
from loopd.cli._harness_serve import harness_app
from loopd.cli._resources_commands import kubeconfig_command, manifests_app
from loopd.cli._run import run_command
from loopd.cli._up import up_command

app = typer.Typer(
    name="loopd",
    help="loopd: durable, observable, permissioned collaboration between humans, operators and agent harnesses.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command("version")
def version_command() -> None:
    """Print the loopd version."""
    typer.echo(__version__)


app.command("up")(up_command)
app.command("chat")(chat_command)
app.command("demo")(demo_command)
app.command("run")(run_command)
app.command("kubeconfig")(kubeconfig_command)
app.add_typer(manifests_app, name="manifests")
app.add_typer(harness_app, name="harness")


def main() -> None:
    app()
