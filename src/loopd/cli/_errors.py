"""How `loopd` commands fail: one line on stderr saying what is wrong and how to fix it, and an exit code.

Exit codes: 2 a usage or configuration error (a bad flag, a missing key, an unreadable policy file), 1 a runtime
failure (a busy port or data directory, an unreachable model or server, anything unexpected), 130 Ctrl-C.
Commands raise `CliError` (or let a known error family through); `report` in the app's entry turns it into the
line. ``--debug`` (or ``LOOPD_DEBUG=1``) prints the traceback before it.

The consoles made by `cli_console` never wrap lines themselves: on a terminal the terminal wraps, and a pipe or a
log file gets each line whole.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import traceback
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Final, TextIO, TypeVar

from loopd._infra import eventloop
from loopd._infra.errors import LoopdError
from loopd._infra.locking import DataDirBusyError
from loopd._infra.telemetry import TracingUnavailable, open_tracing

if TYPE_CHECKING:
    from rich.console import Console

    from loopd.harness.models import ModelConfig

EXIT_RUNTIME: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130
DEBUG_ENV: Final = "LOOPD_DEBUG"
_T = TypeVar("_T")


class CliError(LoopdError):
    """A failure the user can act on: ``message`` (what is wrong), ``hint`` (how to fix it) and the exit code."""

    def __init__(self, message: str, hint: str = "", *, exit_code: int = EXIT_RUNTIME) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code

    def line(self) -> str:
        text = " ".join(self.message.split())  # one line, whatever the message held
        return f"{text}; {self.hint}" if self.hint else text


class _Debug:
    enabled = False


def set_debug(enabled: bool) -> None:
    """Called by the app's ``--debug`` option (on every run of the app)."""
    _Debug.enabled = enabled


def debug_enabled(env: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if env is None else env).get(DEBUG_ENV, "")
    return _Debug.enabled or value.strip().lower() in ("1", "true", "yes", "on")


def cli_console(*, stderr: bool = True, file: TextIO | None = None, **options: Any) -> Console:
    """A Rich console for command output that never inserts line breaks of its own (see the module doc)."""
    from rich.console import Console

    return Console(stderr=stderr, file=file, soft_wrap=True, highlight=False, **options)


def run_async(main: Coroutine[Any, Any, _T]) -> _T:
    """Run a command's ``main`` on loopd's event loop (`loopd._infra.eventloop.run`: uvloop where installed);
    a bad ``LOOPD_EVENT_LOOP`` is a usage error. With ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, traces are exported
    over OTLP/HTTP while it runs (`loopd._infra.telemetry.open_tracing`; flushed when it ends)."""
    command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), "")
    try:
        with open_tracing("loopd", **{"loopd.command": command}):
            return eventloop.run(main)
    except eventloop.EventLoopError as exc:
        raise CliError(str(exc), exit_code=EXIT_USAGE) from None
    except TracingUnavailable as exc:
        main.close()  # never started
        raise CliError(str(exc), exit_code=EXIT_USAGE) from None


def model_config(model: str | None, base_url: str | None = None) -> ModelConfig:
    """The model configuration of the flags and environment, checked before anything starts (`CliError`, exit 2)."""
    from pydantic import ValidationError

    from loopd.harness.models import CassetteError, ModelConfig, PriceTableError

    try:
        config = ModelConfig.from_env(model=model, base_url=base_url)
        config.price_table()
    except PriceTableError as exc:
        raise CliError(f"LOOPD_PRICES: {exc}", "fix the price file or unset it", exit_code=EXIT_USAGE) from exc
    except CassetteError as exc:
        raise CliError(str(exc), exit_code=EXIT_USAGE) from exc
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'model'}: {e['msg']}" for e in exc.errors())
        raise CliError(f"model configuration: {problems}", exit_code=EXIT_USAGE) from exc
    except ValueError as exc:
        raise CliError(f"model configuration: {exc}", exit_code=EXIT_USAGE) from exc
    cassette = config.cassette
    if cassette is not None and cassette.mode == "replay" and not cassette.path.is_file():
        raise CliError(
            f"LOOPD_MODEL_CASSETTE: no cassette at {cassette.path} (replay never calls the provider)",
            "record it first with LOOPD_MODEL_CASSETTE_MODE=record (or auto to record what is missing)",
            exit_code=EXIT_USAGE,
        )
    missing = config.missing_keys()
    if missing == ("ANTHROPIC_API_KEY",):
        raise CliError(
            f"LOOPD_MODEL={config.model} needs ANTHROPIC_API_KEY",
            "set ANTHROPIC_API_KEY (or ANTHROPIC_BASE_URL for another Anthropic-compatible endpoint), "
            "or LOOPD_MODEL=demo to try loopd without a model provider",
            exit_code=EXIT_USAGE,
        )
    if missing:
        raise CliError(
            f"LOOPD_MODEL={config.model} needs {' and '.join(missing)}",
            "set OPENAI_API_KEY (or OPENAI_BASE_URL / --base-url for a keyless OpenAI-compatible server), "
            "or LOOPD_MODEL=demo to try loopd without a model provider",
            exit_code=EXIT_USAGE,
        )
    return config


def address_in_use(exc: OSError, host: str, ports: Mapping[str, int]) -> CliError | None:
    """For a failed bind: a `CliError` naming the busy port and its flag (``ports``: flag → port asked for).

    None when ``exc`` is not "address in use". Ports asked as 0 (any free one) are never the busy ones; of
    several fixed ones, the busy one is found by trying to bind each.
    """
    if exc.errno != errno.EADDRINUSE:
        return None
    fixed = [(flag, port) for flag, port in ports.items() if port]
    busy = fixed if len(fixed) <= 1 else [(flag, port) for flag, port in fixed if not _can_bind(host, port)]
    if not busy:
        return CliError(f"cannot listen on {host}: address already in use", "pass another port (0 picks a free one)")
    flag, port = busy[0]
    return CliError(
        f"port {port} on {host} is already in use", f"stop what uses it, or pass another {flag} (0 picks a free one)"
    )


def require_free_ports(host: str, ports: Mapping[str, int]) -> None:
    """Before anything starts: a `CliError` for the first fixed port (``ports``: flag → port) already in use.

    Only a quick look (the port may still be taken before the server binds it; that bind error says the same), so
    that a busy port is reported at once instead of after starting and stopping everything else.
    """
    for flag, port in ports.items():
        if port and not _can_bind(host, port):
            raise CliError(
                f"port {port} on {host} is already in use",
                f"stop what uses it, or pass another {flag} (0 picks a free one)",
            )


def _can_bind(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno != errno.EADDRINUSE  # other failures are the server's own bind's to report
    return True


def describe(exc: BaseException) -> CliError:
    """The one-line form of ``exc``: itself for a `CliError`, a known family's line, else an internal error."""
    if isinstance(exc, CliError):
        return exc
    # imported here: `loopd --help` and the commands that never touch the harness or httpx do not pay for them
    import httpx

    from loopd.harness import HarnessError, ModelError
    from loopd.harness.gate import GatePolicyError
    from loopd.harness.models import PriceTableError

    if isinstance(exc, DataDirBusyError):
        return CliError(str(exc), "stop it first, or pass another --data-dir")
    if isinstance(exc, GatePolicyError | PriceTableError):
        return CliError(str(exc), exit_code=EXIT_USAGE)
    if isinstance(exc, ModelError):
        return CliError(
            f"the model failed: {exc}", "check LOOPD_MODEL and the provider's *_BASE_URL and *_API_KEY variables"
        )
    if isinstance(exc, HarnessError):
        return CliError(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, httpx.TransportError):
        where = f" {exc.request.url}" if _has_request(exc) else ""
        return CliError(f"cannot reach{where}: {type(exc).__name__}: {exc}", "is the server running?")
    if isinstance(exc, OSError):
        if exc.errno == errno.EADDRINUSE:
            return CliError("address already in use", "pass another port (0 picks a free one)")
        target = f" {exc.filename}" if exc.filename else ""
        return CliError(f"{exc.strerror or type(exc).__name__}:{target}" if target else str(exc))
    return CliError(
        f"internal error: {type(exc).__name__}: {exc}", f"run with --debug (or {DEBUG_ENV}=1) for the traceback"
    )


def _has_request(exc: Any) -> bool:  # an httpx.TransportError
    try:
        exc.request  # noqa: B018  # raises RuntimeError when the error carries no request
    except RuntimeError:
        return False
    return True


def report(exc: BaseException, *, stream: TextIO | None = None, debug: bool | None = None) -> int:
    """Print ``exc`` as one line (after its traceback under ``--debug``); return the exit code."""
    out = stream or sys.stderr
    if debug_enabled() if debug is None else debug:
        traceback.print_exception(exc, file=out)
    error = describe(exc)
    prefix = "\x1b[1;31merror:\x1b[0m" if _is_terminal(out) else "error:"
    out.write(f"{prefix} {error.line()}\n")
    out.flush()
    return error.exit_code


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty() and not os.environ.get("NO_COLOR")
    except (AttributeError, ValueError, OSError):
        return False


__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_RUNTIME",
    "EXIT_USAGE",
    "CliError",
    "address_in_use",
    "cli_console",
    "debug_enabled",
    "describe",
    "model_config",
    "report",
    "require_free_ports",
    "set_debug",
]
