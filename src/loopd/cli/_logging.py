"""The CLI's logging options: ``--log-level`` / ``LOOPD_LOG_LEVEL`` and ``--log-format`` / ``LOOPD_LOG_FORMAT``.

Every command logs at ``warning`` by default — servers (``loopd up``, ``loopd harness serve``) as well as one-shot
commands: what reaches stderr by default is what needs a person's attention (a failed sweep, a lost lease, a
bug caught and logged), and ``--log-level info`` shows a server's routine. ``--debug`` lowers the default to
``debug`` (an explicit ``--log-level`` wins). An unknown level or format is a usage error (exit 2) reported on one
line before the command starts. The configuration itself is the floor's (`loopd._infra.logs`).
"""

from __future__ import annotations

from typing import Final

from loopd._infra.logs import LogSettingsError, configure_logging, parse_level
from loopd.cli._errors import EXIT_USAGE, CliError

LOG_LEVEL_ENV: Final = "LOOPD_LOG_LEVEL"
LOG_FORMAT_ENV: Final = "LOOPD_LOG_FORMAT"
DEFAULT_LEVEL: Final = "warning"
_HINT: Final = "see 'loopd --help'"


def apply_log_options(level: str | None, fmt: str, *, debug: bool = False) -> None:
    """Configure the process's logging from the options (`CliError`, exit 2, for an unknown level or format)."""
    chosen = level if level is not None and level.strip() else ("debug" if debug else DEFAULT_LEVEL)
    try:
        parse_level(chosen)
    except LogSettingsError as exc:
        raise CliError(f"--log-level ({LOG_LEVEL_ENV}): {exc}", _HINT, exit_code=EXIT_USAGE) from exc
    try:
        configure_logging(chosen, fmt.strip().lower())
    except LogSettingsError as exc:
        raise CliError(f"--log-format ({LOG_FORMAT_ENV}): {exc}", _HINT, exit_code=EXIT_USAGE) from exc
