"""The ``--sandbox`` option of the commands that run tools (`loopd run`, `loopd up`, `loopd harness serve`)."""

from __future__ import annotations

from typing import Any

import typer

from loopd.cli._errors import EXIT_USAGE, CliError
from loopd.harness.tools import SANDBOX_MODES, Sandbox, SandboxError, SandboxUnavailableError, resolve_sandbox


def sandbox_option() -> Any:
    """A fresh typer option (each command needs its own instance)."""
    return typer.Option(
        None,
        "--sandbox",
        envvar="LOOPD_SANDBOX",
        show_envvar=True,
        help=(
            f"Where bash runs commands: {' | '.join(SANDBOX_MODES)} (default auto: bubblewrap when it works here, "
            "else none). LOOPD_SANDBOX_NETWORK=1 gives sandboxed commands the network."
        ),
    )


def sandbox_for(mode: str | None) -> Sandbox:
    """The sandbox for the ``--sandbox`` value; a one-line `CliError` (exit 2) when it cannot be had."""
    try:
        return resolve_sandbox(mode)
    except SandboxUnavailableError as exc:
        raise CliError(str(exc), "install bubblewrap, or pass --sandbox none", exit_code=EXIT_USAGE) from exc
    except SandboxError as exc:
        raise CliError(str(exc), exit_code=EXIT_USAGE) from exc
