"""`loopd operator longhorizon` and LongHorizon in `loopd up`: settings from flags over LOOPD_LH_*, and every bad
setting is a one-line usage error naming the flag or the variable (exit 2), before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd.cli._errors import CliError
from loopd.cli._operator import LONGHORIZON_LEASE, longhorizon_program, longhorizon_settings
from tests.cli.conftest import child_env, loopd


def test_flags_win_over_the_environment_and_durations_take_units() -> None:
    env = {"LOOPD_LH_MAX_ROUNDS": "7", "LOOPD_LH_MANAGER_TIMEOUT": "10m", "LOOPD_LH_TARGET": "other"}
    settings = longhorizon_settings(env, max_rounds=3, executor_timeout="90s", target=None)
    assert (settings.max_rounds, settings.manager_timeout, settings.executor_timeout) == (3, 600.0, 90.0)
    assert settings.target == "other"
    program = longhorizon_program(settings)
    assert (program.key, program.actor, program.lease_name) == (
        "longhorizon",
        "operator:longhorizon",
        LONGHORIZON_LEASE,
    )
    assert LONGHORIZON_LEASE == "longhorizon.loopd.dev"


@pytest.mark.parametrize(
    ("env", "flags", "named"),
    [
        ({}, {"max_rounds": 0}, "--max-rounds"),
        ({}, {"manager_timeout": "soon"}, "--manager-timeout"),
        ({"LOOPD_LH_RUN_TIMEOUT": "-5"}, {}, "LOOPD_LH_RUN_TIMEOUT"),
        ({}, {"workspace": "../up"}, "--workspace must be a relative directory"),
        ({}, {"target": "a b"}, "--target must be a harness key"),
        ({"LOOPD_LH_WORKSPACE": "/abs"}, {}, "LOOPD_LH_WORKSPACE must be a relative directory"),
    ],
)
def test_a_bad_setting_is_a_usage_error_naming_it(env: dict[str, str], flags: dict[str, object], named: str) -> None:
    with pytest.raises(CliError) as caught:
        longhorizon_settings(env, **flags)  # type: ignore[arg-type]
    assert caught.value.exit_code == 2
    assert named in caught.value.line()


def test_the_standalone_command_fails_in_one_line_on_a_bad_flag(tmp_path: Path) -> None:
    home = tmp_path / "home"
    line = loopd(["operator", "longhorizon", "--max-rounds", "1001"], env=child_env(home)).one_line_error(2)
    assert "--max-rounds must be an integer from 1 to 1000, not '1001'" in line
    line = loopd(["operator", "longhorizon", "--data-dir", str(tmp_path)], env=child_env(home)).one_line_error(2)
    assert "no running `loopd up` recorded in" in line
    help_text = loopd(["operator", "longhorizon", "--help"], env=child_env(home, COLUMNS="200")).stdout
    for flag in ("--server", "--token", "--data-dir", "--max-rounds", "--executor-timeout", "--lease-name"):
        assert flag in help_text
    assert "longhorizon.loopd.dev" in help_text


def test_loopd_up_refuses_a_bad_lh_variable_in_one_line_before_starting(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = loopd(["up", "--port", "0"], env=child_env(home, LOOPD_LH_EXECUTOR_TIMEOUT="0"))
    line = result.one_line_error(2)
    assert "LOOPD_LH_EXECUTOR_TIMEOUT must be a positive duration" in line and "--no-longhorizon" in line
    assert not (home / "server.json").exists()


def test_the_chat_help_shows_the_longhorizon_path(tmp_path: Path) -> None:
    help_text = loopd(["chat", "--help"], env=child_env(tmp_path, COLUMNS="200")).stdout
    assert 'loopd chat --to operator:longhorizon "Create hello.txt containing hello world"' in help_text
