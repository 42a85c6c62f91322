"""`loopd --log-level / --log-format` (and LOOPD_LOG_LEVEL / LOOPD_LOG_FORMAT) configure the process's logging:
text or one JSON object per line on stderr; a bad level or format is one line and exit 2."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopd._infra.logs import (
    JsonFormatter,
    LogSettingsError,
    configure_logging,
    is_configured,
    parse_level,
    reset_logging,
)
from loopd.cli._app import run_app
from tests.cli.conftest import child_env, loopd


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    reset_logging()
    yield
    reset_logging()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def _json_lines(text: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_json_debug_logs_are_one_object_per_line_on_stderr(home: Path) -> None:
    result = loopd(["--log-format", "json", "--log-level", "debug", "version"], env=child_env(home))
    assert result.code == 0 and result.stdout.strip()  # the command's output stays on stdout
    records = _json_lines(result.stderr)  # every stderr line parses as JSON
    assert records, "no log line at debug level"
    for record in records:
        assert {"time", "level", "logger", "message"} <= record.keys()
    assert {"level": "debug", "logger": "loopd._infra.logs", "message": "logging at debug as json"}.items() <= (
        records[0].items()
    )


def test_the_environment_sets_level_and_format(home: Path) -> None:
    env = child_env(home, LOOPD_LOG_LEVEL="DEBUG", LOOPD_LOG_FORMAT="json")
    result = loopd(["version"], env=env)
    assert result.code == 0
    assert _json_lines(result.stderr)[0]["level"] == "debug"


def test_by_default_nothing_below_warning_is_logged(home: Path) -> None:
    result = loopd(["version"], env=child_env(home))
    assert (result.code, result.stderr) == (0, "")


@pytest.mark.parametrize(
    ("args", "env", "option"),
    [
        (["--log-level", "loud", "version"], {}, "--log-level"),
        (["version"], {"LOOPD_LOG_LEVEL": "verbose"}, "--log-level"),
        (["--log-format", "xml", "version"], {}, "--log-format"),
    ],
)
def test_an_unknown_level_or_format_is_one_line_and_exit_2(
    home: Path, args: list[str], env: dict[str, str], option: str
) -> None:
    line = loopd(args, env=child_env(home, **env)).one_line_error(2)
    assert line.startswith(f"error: {option}") and "see 'loopd --help'" in line


def test_in_process_the_app_configures_the_root_logger(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_app(["--log-format", "json", "--log-level", "info", "version"]) == 0
    assert is_configured()
    logging.getLogger("loopd.test").info("hello %s", "there")
    logging.getLogger("loopd.test").debug("below the level")
    records = _json_lines(capsys.readouterr().err)
    assert [(r["level"], r["logger"], r["message"]) for r in records] == [("info", "loopd.test", "hello there")]


def test_debug_lowers_the_default_level_but_an_explicit_level_wins() -> None:
    assert run_app(["--debug", "version"]) == 0
    assert logging.getLogger().level == logging.DEBUG
    assert run_app(["--debug", "--log-level", "error", "version"]) == 0
    assert logging.getLogger().level == logging.ERROR


def test_a_bad_level_in_process_exits_2_before_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_app(["--log-level", "nope", "version"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # the command did not run
    assert captured.err.count("\n") == 1 and captured.err.startswith("error: --log-level")


def test_json_lines_carry_the_traceback() -> None:
    try:
        raise ValueError("broken")
    except ValueError:
        record = logging.LogRecord("loopd.x", logging.ERROR, __file__, 1, "failed: %s", ("it",), sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert (entry["level"], entry["logger"], entry["message"]) == ("error", "loopd.x", "failed: it")
    assert entry["exc_info"].startswith("Traceback (most recent call last)")
    assert "ValueError: broken" in entry["exc_info"]
    assert entry["time"].endswith("+00:00")


def test_text_lines_name_time_level_and_logger() -> None:
    out = io.StringIO()
    configure_logging("info", "text", stream=out)
    logging.getLogger("loopd.y").warning("careful")
    assert out.getvalue().rstrip().endswith("WARNING loopd.y: careful")


def test_uvicorns_loggers_follow_the_configuration() -> None:
    noisy = logging.getLogger("uvicorn")
    noisy.addHandler(logging.NullHandler())
    noisy.propagate = False
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    logging.getLogger("uvicorn.error").info("Started server process")
    assert _json_lines(out.getvalue())[-1]["logger"] == "uvicorn.error"
    assert logging.getLogger("uvicorn").handlers == []


def test_configuring_twice_replaces_the_handler() -> None:
    configure_logging("info", "text", stream=io.StringIO())
    configure_logging("info", "json", stream=io.StringIO())
    assert sum(type(h).__name__ == "_LoopdHandler" for h in logging.getLogger().handlers) == 1


@pytest.mark.parametrize("text", ["debug", "INFO", " Warning "])
def test_levels_are_named_in_any_case(text: str) -> None:
    assert parse_level(text) in (logging.DEBUG, logging.INFO, logging.WARNING)


def test_a_level_must_be_one_of_five() -> None:
    with pytest.raises(LogSettingsError, match="use one of: debug, info, warning, error, critical"):
        parse_level("trace")
