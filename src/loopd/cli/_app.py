"""The `loopd` command line.

`main` is the one place where a command's failure becomes its one-line message and exit code (see
`loopd.cli._errors`): usage errors exit 2, known runtime failures 1, anything unexpected 1 as an "internal error".
The group's options configure logging for every command before it runs (see `loopd.cli._logging`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperGroup

from loopd import __version__
from loopd.cli._access_commands import signin_link_command, token_app
from loopd.cli._chat import chat_command
from loopd.cli._demo import demo_command
from loopd.cli._errors import DEBUG_ENV, EXIT_INTERRUPTED, EXIT_RUNTIME, EXIT_USAGE, report, set_debug
from loopd.cli._harness_serve import harness_app
from loopd.cli._ledger_commands import cost_command, ledger_command
from loopd.cli._logging import LOG_FORMAT_ENV, LOG_LEVEL_ENV, apply_log_options
from loopd.cli._operator import operator_app
from loopd.cli._resources_commands import kubeconfig_command, manifests_app
from loopd.cli._run import run_command
from loopd.cli._server import config_app, server_command
from loopd.cli._up import up_command


class _ReportingGroup(TyperGroup):
    """The `loopd` group: any error a command raises becomes its one-line report and exit code, here.

    Catching it at the group (rather than only in `main`) makes `typer.testing.CliRunner` see what a user sees.
    """

    def invoke(self, ctx: Any) -> Any:  # typer's click Context (its module is private)
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except Exception as exc:
            raise typer.Exit(report(exc)) from exc


app = typer.Typer(
    name="loopd",
    cls=_ReportingGroup,
    help="loopd: durable, observable, permissioned collaboration between humans, operators and agent harnesses.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,  # `main` reports errors; a Rich traceback with locals could show secrets
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(
        False,
        "--debug",
        envvar=DEBUG_ENV,
        help="On an error, print the traceback too; log at debug level unless --log-level says otherwise "
        "(also LOOPD_DEBUG=1).",
    ),
    log_level: str | None = typer.Option(
        None,
        "--log-level",
        envvar=LOG_LEVEL_ENV,
        metavar="LEVEL",
        help="Log records at this level and above on stderr: debug, info, warning (default), error, critical.",
    ),
    log_format: str = typer.Option(
        "text",
        "--log-format",
        envvar=LOG_FORMAT_ENV,
        metavar="FORMAT",
        help="text, or json: one JSON object per line (time, level, logger, message, exc_info).",
    ),
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the loopd version and exit."
    ),
) -> None:
    """loopd: durable, observable, permissioned collaboration between humans, operators and agent harnesses."""
    del version  # handled by its callback
    set_debug(debug)
    apply_log_options(log_level, log_format, debug=debug)


@app.command("version")
def version_command() -> None:
    """Print the loopd version."""
    typer.echo(__version__)


app.command("up")(up_command)
app.command("server")(server_command)
app.command("chat")(chat_command)
app.command("ledger")(ledger_command)
app.command("cost")(cost_command)
app.command("demo")(demo_command)
app.command("run")(run_command)
app.command("kubeconfig")(kubeconfig_command)
app.command("signin-link")(signin_link_command)
app.add_typer(token_app, name="token")
app.add_typer(manifests_app, name="manifests")
app.add_typer(harness_app, name="harness")
app.add_typer(operator_app, name="operator")
app.add_typer(config_app, name="config")


def run_app(args: Sequence[str] | None = None) -> int:
    """Run `loopd` with ``args`` (default: the process's); return the exit code after printing any error."""
    try:
        result = app(args=None if args is None else list(args), prog_name="loopd", standalone_mode=False)
    except typer.TyperException as exc:  # typer's command-line errors (its own click)
        if type(exc).__name__ == "NoArgsIsHelpError":
            return EXIT_USAGE  # the help is already printed
        if exc.exit_code == EXIT_USAGE:  # a usage error: a bad flag, a missing or bad argument
            ctx = getattr(exc, "ctx", None)
            command = getattr(ctx, "command_path", None) or "loopd"
            sys.stderr.write(f"error: {exc.format_message()} (see '{command} --help')\n")
        else:
            sys.stderr.write(f"error: {exc.format_message()}\n")
        return exc.exit_code
    except typer.Abort:
        sys.stderr.write("aborted\n")
        return EXIT_RUNTIME
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:  # raised outside a command (the group reports those): one line, not a traceback
        return report(exc)
    return result if isinstance(result, int) else 0


def main() -> None:
    sys.exit(run_app())
