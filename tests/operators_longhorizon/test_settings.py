"""LongHorizonSettings: the reference's defaults, LOOPD_LH_* variables under explicit values, one-line errors."""

from __future__ import annotations

import pytest

from loopd.operators.longhorizon._errors import LongHorizonSettingsError
from loopd.operators.longhorizon._settings import LongHorizonSettings, parse_duration


def test_the_defaults_follow_the_reference() -> None:
    settings = LongHorizonSettings.from_env({})

    assert (settings.max_rounds, settings.manager_timeout, settings.executor_timeout, settings.auditor_timeout) == (
        25,
        300.0,
        1800.0,
        300.0,
    )
    assert (settings.human_timeout, settings.run_timeout, settings.retention_ttl) == (1800.0, 86400.0, 86400.0)
    assert (settings.target, settings.workspace, settings.concurrency) == ("assistant", "runs", 4)


def test_the_environment_is_read_and_explicit_values_win() -> None:
    env = {
        "LOOPD_LH_MAX_ROUNDS": " 40 ",
        "LOOPD_LH_MANAGER_TIMEOUT": "90s",
        "LOOPD_LH_EXECUTOR_TIMEOUT": "1h30m",
        "LOOPD_LH_HUMAN_TIMEOUT": "600",
        "LOOPD_LH_RETENTION_TTL": "2d",
        "LOOPD_LH_TARGET": "helper",
        "LOOPD_LH_WORKSPACE": "lh/runs",
    }

    settings = LongHorizonSettings.from_env(env, max_rounds=7, target=None)

    assert settings.max_rounds == 7 and settings.target == "helper" and settings.workspace == "lh/runs"
    assert (settings.manager_timeout, settings.executor_timeout, settings.human_timeout) == (90.0, 5400.0, 600.0)
    assert settings.retention_ttl == 172800.0 and settings.timeout_of("executor") == 5400.0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LOOPD_LH_MAX_ROUNDS": "0"}, "LOOPD_LH_MAX_ROUNDS must be an integer from 1 to 1000, not '0'"),
        ({"LOOPD_LH_MAX_ROUNDS": "1001"}, "LOOPD_LH_MAX_ROUNDS must be an integer from 1 to 1000, not '1001'"),
        ({"LOOPD_LH_RUN_TIMEOUT": "-5m"}, "LOOPD_LH_RUN_TIMEOUT must be a positive duration"),
        ({"LOOPD_LH_HUMAN_TIMEOUT": "0"}, "LOOPD_LH_HUMAN_TIMEOUT must be a positive duration"),
        ({"LOOPD_LH_AUDITOR_TIMEOUT": "5 minutes"}, "LOOPD_LH_AUDITOR_TIMEOUT must be a positive duration"),
        ({"LOOPD_LH_CONCURRENCY": "x"}, "LOOPD_LH_CONCURRENCY must be a positive integer, not 'x'"),
        ({"LOOPD_LH_TARGET": "a b"}, "LOOPD_LH_TARGET must be a harness key"),
        ({"LOOPD_LH_WORKSPACE": "../up"}, "LOOPD_LH_WORKSPACE must be a relative directory"),
        ({"LOOPD_LH_WORKSPACE": "/abs"}, "LOOPD_LH_WORKSPACE must be a relative directory"),
    ],
)
def test_invalid_values_are_one_line_typed_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(LongHorizonSettingsError, match=message.replace("(", r"\(")) as caught:
        LongHorizonSettings.from_env(env)
    assert "\n" not in str(caught.value) and isinstance(caught.value, ValueError)


def test_durations() -> None:
    assert parse_duration("300") == 300.0 and parse_duration("1h30m") == 5400.0 and parse_duration("0.5s") == 0.5
    for bad in ("", "m5", "5x", "-1", "nan", "1m 5s"):
        with pytest.raises(ValueError):
            parse_duration(bad)
