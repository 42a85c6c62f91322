"""Every `loopd` command fails the common ways with one line on stderr (what is wrong, how to fix it) and the exit
code: 2 for usage and configuration errors, 1 for runtime failures. ``--debug`` / ``LOOPD_DEBUG=1`` add the
traceback. Each case runs the real console script, its output going to pipes (not a terminal)."""

from __future__ import annotations

import io
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.text import Text

from loopd import __version__
from loopd._infra.locking import data_dir_lock
from loopd.cli._errors import CliError, cli_console, describe, report
from tests.cli.conftest import child_env, loopd

NO_KEY = {"LOOPD_MODEL": "gpt-4o-mini"}  # and no OPENAI_API_KEY / OPENAI_BASE_URL (child_env drops them)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again on return: nothing listens there


# --- configuration: exit 2 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [["up", "--port", "0"], ["run", "hello"], ["harness", "serve", "--port", "0"]],
    ids=["up", "run", "harness-serve"],
)
def test_a_real_model_without_a_key_is_one_line_and_exit_2(args: list[str], home: Path, tmp_path: Path) -> None:
    result = loopd(args, env=child_env(home, **NO_KEY), cwd=tmp_path)
    line = result.one_line_error(2)
    assert "OPENAI_API_KEY" in line and "LOOPD_MODEL=demo" in line
    assert len(line) > 80  # one line although longer than the 80 columns a pipe gets


def test_a_bad_flag_is_one_line_and_exit_2(home: Path) -> None:
    line = loopd(["run", "--no-such-flag"], env=child_env(home)).one_line_error(2)
    assert "--no-such-flag" in line and "loopd run --help" in line
    line = loopd(["up", "--port", "eighty"], env=child_env(home)).one_line_error(2)
    assert "--port" in line


def test_no_command_shows_the_help_and_exits_2(home: Path) -> None:
    result = loopd([], env=child_env(home))
    assert result.code == 2
    assert "Usage" in result.stdout and "Traceback" not in result.stderr


def test_version_flag_and_command(home: Path) -> None:
    for args in (["--version"], ["version"]):
        result = loopd(args, env=child_env(home))
        assert result.code == 0, result.stderr
        assert result.stdout.strip() == __version__


# --- runtime: exit 1 -----------------------------------------------------------------------------------------


def test_a_port_in_use_names_the_port_and_the_flag(busy_port: int, home: Path, tmp_path: Path) -> None:
    up = loopd(["up", "--port", str(busy_port), "--data-dir", str(tmp_path / "up")], env=child_env(home))
    line = up.one_line_error(1)
    assert f"port {busy_port}" in line and "--port" in line and "--api-port" not in line

    serve = loopd(
        ["harness", "serve", "--port", str(busy_port), "--data-dir", str(tmp_path / "serve")],
        env=child_env(home),
        cwd=tmp_path,
    )
    line = serve.one_line_error(1)
    assert f"port {busy_port}" in line and "--port" in line


def test_a_busy_api_port_names_api_port(busy_port: int, home: Path, tmp_path: Path) -> None:
    free = _closed_port()
    args = ["up", "--port", str(free), "--api-port", str(busy_port), "--data-dir", str(tmp_path / "up")]
    line = loopd(args, env=child_env(home)).one_line_error(1)
    assert f"port {busy_port}" in line and "--api-port" in line


def test_a_data_dir_in_use_is_one_line(home: Path, tmp_path: Path) -> None:
    data_dir = tmp_path / "up"
    data_dir.mkdir()
    with data_dir_lock(data_dir, "loopd.lock", holder="loopd up"):  # what a running `loopd up` holds
        line = loopd(["up", "--port", "0", "--data-dir", str(data_dir)], env=child_env(home)).one_line_error(1)
    assert str(data_dir) in line and f"pid {os.getpid()}" in line and "--data-dir" in line


def test_an_unreachable_model_fails_the_turn_in_one_line(home: Path, tmp_path: Path) -> None:
    env = child_env(home, LOOPD_MODEL="some-model", OPENAI_BASE_URL=f"http://127.0.0.1:{_closed_port()}/v1")
    result = loopd(["run", "hi", "--data-dir", str(tmp_path / "data")], env=env, cwd=tmp_path)
    assert result.code == 1
    assert "Traceback" not in result.stderr
    failures = [line for line in result.error_lines if "turn failed" in line or "error:" in line]
    assert len(failures) == 1, result.stderr
    assert "turn failed" in failures[0] and "connection" in failures[0]
    assert f"is the model server at {env['OPENAI_BASE_URL']} reachable? (OPENAI_BASE_URL / --base-url)" in failures[0]


def test_chat_without_a_server_is_one_line(home: Path, tmp_path: Path) -> None:
    line = loopd(["chat", "hello", "--data-dir", str(tmp_path)], env=child_env(home)).one_line_error(2)
    assert "no running loopd found" in line and "loopd up" in line


def test_chat_to_a_server_that_is_gone_is_one_line(home: Path, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    line = loopd(["chat", "hello", "--server", url, "--token", "t"], env=child_env(home)).one_line_error(1)
    assert f"cannot reach loopd at {url}" in line and "loopd up" in line


# --- --debug -------------------------------------------------------------------------------------------------


def test_debug_adds_the_traceback(home: Path, tmp_path: Path) -> None:
    for args, extra in ((["--debug", "up", "--port", "0"], {}), (["up", "--port", "0"], {"LOOPD_DEBUG": "1"})):
        result = loopd(args, env=child_env(home, **NO_KEY, **extra), cwd=tmp_path)
        assert result.code == 2
        assert "Traceback (most recent call last)" in result.stderr
        assert result.error_lines[-1].startswith("error: LOOPD_MODEL=gpt-4o-mini needs OPENAI_API_KEY")


# --- the pieces ----------------------------------------------------------------------------------------------


def test_an_unexpected_exception_is_an_internal_error_line() -> None:
    out = io.StringIO()
    code = report(ZeroDivisionError("division by zero"), stream=out, debug=False)
    assert code == 1
    assert out.getvalue() == (
        "error: internal error: ZeroDivisionError: division by zero; run with --debug (or LOOPD_DEBUG=1) "
        "for the traceback\n"
    )
    out = io.StringIO()
    try:
        raise ZeroDivisionError("boom")
    except ZeroDivisionError as exc:
        report(exc, stream=out, debug=True)
    assert "Traceback" in out.getvalue() and out.getvalue().endswith(
        "ZeroDivisionError: boom; run with --debug (or LOOPD_DEBUG=1) for the traceback\n"
    )


def test_a_multi_line_message_becomes_one_line() -> None:
    error = describe(CliError("first\nsecond", "do this", exit_code=2))
    assert error.line() == "first second; do this" and error.exit_code == 2


def test_cli_consoles_do_not_wrap_when_not_on_a_terminal() -> None:
    out = io.StringIO()
    console = cli_console(file=out)
    assert not console.is_terminal
    text = "word " * 60  # 300 characters
    console.print(text)
    console.print(Text(text, style="dim"))
    console.print(f"[red]{text}[/]")
    lines = out.getvalue().splitlines()
    assert lines == [text.rstrip()] * 3 or lines == [text] * 3, lines


def test_the_loopd_script_is_this_interpreters() -> None:
    assert Path(sys.executable).parent.joinpath("loopd").exists()


# --- in process (typer's CliRunner sees what a user sees) ------------------------------------------------------


def test_the_app_itself_reports_errors_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from loopd.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["up", "--port", "0"], env={"LOOPD_MODEL": "gpt-4o-mini", "OPENAI_API_KEY": None})
    assert result.exit_code == 2
    assert [line for line in result.output.splitlines() if line.strip()] == [
        "error: LOOPD_MODEL=gpt-4o-mini needs OPENAI_API_KEY; set OPENAI_API_KEY (or OPENAI_BASE_URL / --base-url "
        "for a keyless OpenAI-compatible server), or LOOPD_MODEL=demo to try loopd without a model provider"
    ]

    def broken() -> str:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr("loopd.cli._resources_commands.render_crds", broken)
    result = runner.invoke(app, ["manifests", "crds"], env={"LOOPD_DEBUG": None})
    assert result.exit_code == 1
    assert result.output == (
        "error: internal error: ZeroDivisionError: division by zero; run with --debug (or LOOPD_DEBUG=1) "
        "for the traceback\n"
    )
    result = runner.invoke(app, ["--debug", "manifests", "crds"])
    assert result.exit_code == 1
    assert "Traceback (most recent call last)" in result.output and "internal error" in result.output


def test_a_failed_bind_names_the_busy_port_among_several(busy_port: int) -> None:
    import errno

    from loopd.cli._errors import address_in_use

    exc = OSError(errno.EADDRINUSE, "Address already in use")
    error = address_in_use(exc, "127.0.0.1", {"--port": _closed_port(), "--api-port": busy_port})
    assert error is not None and error.line() == (
        f"port {busy_port} on 127.0.0.1 is already in use; stop what uses it, or pass another --api-port "
        "(0 picks a free one)"
    )
    assert address_in_use(OSError(errno.EACCES, "Permission denied"), "127.0.0.1", {"--port": 80}) is None
