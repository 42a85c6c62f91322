"""RouterSettings: defaults, LOOPD_ROUTER_* variables under explicit values, one-line typed errors."""

from __future__ import annotations

import pytest

from loopd.operators.router import RouterSettings, RouterSettingsError


def test_the_defaults_follow_the_reference() -> None:
    settings = RouterSettings.from_env({})

    assert settings == RouterSettings(max_subtasks=4, concurrency=4, target="assistant", call_timeout=1800)


def test_the_environment_is_read_and_explicit_values_win() -> None:
    env = {
        "LOOPD_ROUTER_MAX_SUBTASKS": " 6 ",
        "LOOPD_ROUTER_CONCURRENCY": "2",
        "LOOPD_ROUTER_TARGET": "helper",
        "LOOPD_ROUTER_CALL_TIMEOUT": "60",
    }

    assert RouterSettings.from_env(env) == RouterSettings(6, 2, "helper", 60)
    assert RouterSettings.from_env(env, max_subtasks=3, target="assistant") == RouterSettings(3, 2, "assistant", 60)


def test_empty_variables_mean_the_default() -> None:
    assert RouterSettings.from_env({"LOOPD_ROUTER_MAX_SUBTASKS": "", "LOOPD_ROUTER_TARGET": " "}) == RouterSettings()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LOOPD_ROUTER_MAX_SUBTASKS": "0"}, "LOOPD_ROUTER_MAX_SUBTASKS must be a positive integer, not '0'"),
        ({"LOOPD_ROUTER_CONCURRENCY": "four"}, "LOOPD_ROUTER_CONCURRENCY must be a positive integer, not 'four'"),
        ({"LOOPD_ROUTER_CALL_TIMEOUT": "-5"}, "LOOPD_ROUTER_CALL_TIMEOUT must be a positive integer, not '-5'"),
        ({"LOOPD_ROUTER_TARGET": "a b"}, "target must be a harness key"),
    ],
)
def test_a_bad_variable_is_a_one_line_typed_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(RouterSettingsError) as caught:
        RouterSettings.from_env(env)

    assert message in str(caught.value)
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"max_subtasks": 0}, "max_subtasks must be a positive integer, not 0"),
        ({"concurrency": True}, "concurrency must be a positive integer, not True"),
        ({"target": ""}, "target must be a harness key"),
    ],
)
def test_bad_explicit_values_are_refused(values: dict[str, object], message: str) -> None:
    with pytest.raises(RouterSettingsError, match=message):
        RouterSettings(**values)  # type: ignore[arg-type]
