"""The `loopd` command line.

`main` is the one place where a command's failure becomes its one-line message and exit code (see
`loopd.cli._errors`): usage errors exit 2, known runtime failures 1, anything unexpected 1 as an "internal error".
The group's options configure logging for every command before it runs (see `loopd.cli._logging`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import typer
from typer.core import TyperCommand, TyperGroup

from loopd import __version__
from loopd.cli._errors import DEBUG_ENV, EXIT_INTERRUPTED, EXIT_RUNTIME, EXIT_USAGE, report, set_debug
from loopd.cli._logging import LOG_FORMAT_ENV, LOG_LEVEL_ENV, apply_log_options


@dataclass(frozen=True, slots=True)
class _Lazy:
    """A command whose module is imported only when it runs (or its own help is asked for).

    ``attribute`` is its function (a command) or its `typer.Typer` (a group of commands); ``summary`` is the line
    `loopd --help` lists for it without importing it (a test keeps it equal to the command's own first line).
    """

    module: str
    attribute: str
    summary: str

    def load(self, name: str) -> Any:  # typer's (vendored) click command
        target = getattr(importlib.import_module(self.module), self.attribute)
        if isinstance(target, typer.Typer):
            group = typer.main.get_group(target)
            group.name = name
            return group
        single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        single.command(name)(target)
        return typer.main.get_command(single)


# The commands after `version`, in the order `loopd --help` lists them. Importing every command module costs more
# than a second (the server, the harness, httpx, FastAPI); a command imports only its own.
LAZY_COMMANDS: Final[dict[str, _Lazy]] = {
    "up": _Lazy(
        "loopd.cli._up",
        "up_command",
        "Run loop-server: HTTP API, Kubernetes-compatible API, Harness Engine and the built-in `assistant` harness.",
    ),
    "server": _Lazy(
        "loopd.cli._server",
        "server_command",
        "Run loop-server alone (HTTP API, web UI, Harness Engine, harness targets): no operators in this process.",
    ),
    "chat": _Lazy("loopd.cli._chat", "chat_command", "Ask a responder through a running loopd and stream the answer."),
    "ledger": _Lazy(
        "loopd.cli._ledger_commands",
        "ledger_command",
        "Show a Task's ledger trail as a tree: calls, model and tool calls, attempts, timings, tokens and USD.",
    ),
    "cost": _Lazy(
        "loopd.cli._ledger_commands",
        "cost_command",
        "Show what model calls cost: tokens and USD per conversation, harness target or model, with a bar chart.",
    ),
    "demo": _Lazy(
        "loopd.cli._demo",
        "demo_command",
        "Run a short durable harness session with the scripted model: a tool step, a streamed answer, a restore.",
    ),
    "run": _Lazy(
        "loopd.cli._run",
        "run_command",
        "Talk to the harness in the terminal: stream answers, show tool calls, ask before tools act.",
    ),
    "kubeconfig": _Lazy(
        "loopd.cli._resources_commands",
        "kubeconfig_command",
        "Print a kubeconfig (server URL, CA, bearer token) for loopd's Kubernetes-compatible API.",
    ),
    "signin-link": _Lazy(
        "loopd.cli._access_commands",
        "signin_link_command",
        "Print a one-time sign-in link for a browser (on this machine or another); it expires in 10 minutes.",
    ),
    "token": _Lazy(
        "loopd.cli._access_commands",
        "token_app",
        "Tokens for operators and harnesses (each token is one identity).",
    ),
    "manifests": _Lazy("loopd.cli._resources_commands", "manifests_app", "Print deployment manifests."),
    "harness": _Lazy("loopd.cli._harness_serve", "harness_app", "The built-in agent harness as a service."),
    "operator": _Lazy(
        "loopd.cli._operator",
        "operator_app",
        "Run loopd's operators as their own processes (the Router and LongHorizon run inside `loopd up` too).",
    ),
    "config": _Lazy("loopd.cli._server", "config_app", "The server's configuration file."),
}


class _Pending(TyperCommand):
    """What the group holds for a command not imported yet: its name and summary, enough for `loopd --help`."""


class _ReportingGroup(TyperGroup):
    """The `loopd` group: any error a command raises becomes its one-line report and exit code, here; the commands
    of `LAZY_COMMANDS` are imported when resolved.

    Catching errors at the group (rather than only in `main`) makes `typer.testing.CliRunner` see what a user sees.
    """

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for name, lazy in LAZY_COMMANDS.items():
            self.commands.setdefault(name, _Pending(name=name, help=lazy.summary))

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if name is not None and isinstance(command, _Pending):
            command = self.load(name)
        return name, command, rest

    def load(self, name: str) -> Any:
        """The command ``name``, its module imported (kept for the rest of this invocation)."""
        command = self.commands[name]
        if isinstance(command, _Pending):
            command = self.commands[name] = LAZY_COMMANDS[name].load(name)
        return command

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


def command_tree() -> Any:
    """The whole `loopd` command tree as typer's click group, every command imported (for tools and tests that
    walk it; a run of `loopd` imports only the command it runs)."""
    group: Any = typer.main.get_command(app)
    for name in LAZY_COMMANDS:
        group.load(name)
    return group


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
