"""`loopd operator router`: how it finds the server, its token and the Kubernetes API, and how it fails (one line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopd.cli._errors import CliError
from loopd.cli._operator import resolve_connection
from loopd.resources import load_or_create_credentials, write_endpoint
from tests.cli.conftest import child_env, loopd


def _record_server(data_dir: Path, url: str = "http://127.0.0.1:8420", api: str = "https://127.0.0.1:9443") -> str:
    """What a running `loopd up` leaves in its data directory; returns its admin token."""
    credentials = load_or_create_credentials(data_dir)
    write_endpoint(data_dir, api)
    (data_dir / "server.json").write_text(json.dumps({"url": url, "token_file": str(credentials.directory / "token")}))
    return credentials.token


def _user(kubeconfig: object) -> dict[str, object]:
    assert isinstance(kubeconfig, dict)
    users = kubeconfig["users"]
    assert isinstance(users, list)
    user = users[0]["user"]
    assert isinstance(user, dict)
    return user


def test_a_data_dir_gives_the_url_the_admin_token_and_a_kubeconfig_for_its_api(tmp_path: Path) -> None:
    admin = _record_server(tmp_path)
    connection = resolve_connection(server=None, token=None, data_dir=tmp_path, kubeconfig=None, env={})
    assert connection.server_url == "http://127.0.0.1:8420"
    assert connection.token == admin and connection.acting_as_admin
    assert isinstance(connection.kubeconfig, dict)
    assert connection.kubeconfig["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:9443"
    assert _user(connection.kubeconfig)["token"] == admin


def test_a_token_flag_wins_and_goes_into_the_kubeconfig_too(tmp_path: Path) -> None:
    _record_server(tmp_path)
    connection = resolve_connection(server=None, token="op-token", data_dir=tmp_path, kubeconfig=None, env={})
    assert connection.token == "op-token" and not connection.acting_as_admin
    assert _user(connection.kubeconfig)["token"] == "op-token"


def test_server_and_token_without_a_data_dir_use_the_given_or_default_kubeconfig(tmp_path: Path) -> None:
    env = {"LOOPD_SERVER": "http://h:1/", "LOOPD_TOKEN": "t", "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": "h"}
    connection = resolve_connection(server=None, token=None, data_dir=None, kubeconfig=None, env=env)
    assert (connection.server_url, connection.token, connection.kubeconfig) == ("http://h:1", "t", None)
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("apiVersion: v1\n")  # ~/.kube/config: the client's default
    default = resolve_connection(
        server="http://h:1", token="t", data_dir=None, kubeconfig=None, env={"HOME": str(tmp_path)}
    )
    assert default.kubeconfig is None
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\n")
    given = resolve_connection(server="http://h:2", token="u", data_dir=None, kubeconfig=config, env={})
    assert given.kubeconfig == config


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"server": "http://h:1"}, "no token for http://h:1"),
        ({"data_dir": "empty"}, "no running `loopd up` recorded in"),
        ({"server": "http://h:1", "token": "t", "kubeconfig": "missing"}, "no kubeconfig at"),
    ],
)
def test_what_is_missing_is_a_usage_error_naming_it(tmp_path: Path, flags: dict[str, str], expected: str) -> None:
    (tmp_path / "empty").mkdir()
    arguments: dict[str, object] = {"server": None, "token": None, "data_dir": None, "kubeconfig": None}
    arguments.update({k: tmp_path / v if k in ("data_dir", "kubeconfig") else v for k, v in flags.items()})
    with pytest.raises(CliError) as caught:
        resolve_connection(**arguments, env={})  # type: ignore[arg-type]
    assert caught.value.exit_code == 2
    assert expected in caught.value.line()


def test_no_kubernetes_api_anywhere_is_a_usage_error_saying_how_to_name_one(tmp_path: Path) -> None:
    for env, expected in (
        ({"HOME": str(tmp_path)}, "no Kubernetes API to use"),
        ({"HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "gone")}, "no kubeconfig at"),
    ):
        with pytest.raises(CliError) as caught:
            resolve_connection(server="http://h:1", token="t", data_dir=None, kubeconfig=None, env=env)
        assert caught.value.exit_code == 2
        assert expected in caught.value.line() and "--kubeconfig" in caught.value.line()


def test_a_data_dir_without_its_api_endpoint_says_so(tmp_path: Path) -> None:
    _record_server(tmp_path)
    (tmp_path / "resources-api" / "endpoint").unlink()
    with pytest.raises(CliError, match="no running loopd API recorded"):
        resolve_connection(server=None, token=None, data_dir=tmp_path, kubeconfig=None, env={})


def test_the_command_fails_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    line = loopd(["operator", "router", "--data-dir", str(tmp_path)], env=child_env(home)).one_line_error(2)
    assert "no running `loopd up` recorded in" in line
    line = loopd(
        ["operator", "router", "--server", "http://127.0.0.1:9", "--token", "t", "--kubeconfig", str(tmp_path / "k")],
        env=child_env(home),
    ).one_line_error(2)
    assert "no kubeconfig at" in line
    line = loopd(["operator", "router", "--max-subtasks", "0"], env=child_env(home)).one_line_error(2)
    assert line.startswith("error: --max-subtasks must be a positive integer"), line
    line = loopd(["operator", "router"], env=child_env(home, LOOPD_ROUTER_TARGET="a b")).one_line_error(2)
    assert "LOOPD_ROUTER_TARGET must be a harness key" in line
    help_text = loopd(["operator", "router", "--help"], env=child_env(home)).stdout
    for flag in ("--server", "--token", "--data-dir", "--kubeconfig", "--max-subtasks", "--concurrency", "--target"):
        assert flag in help_text
