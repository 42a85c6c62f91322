"""How `loopd server` / `loopd up` settle their settings: flags over ``LOOPD_*`` over the file over the defaults, and
where Tasks live (`resolve_kube_api`, `resolve_namespace`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd.cli._errors import CliError
from loopd.cli._server import read_config, server_settings
from loopd.server import ServerSetupError, resolve_kube_api, resolve_namespace

FILE = """\
listen: {host: 127.0.0.1, port: 9001, api_port: 9002}
data_dir: state
capacity: {harness_calls: 7, task_workers: 3}
timeouts: {harness_call: 120, lease_ttl: 12}
kubernetes: {api: embedded, namespace: team}
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LOOPD_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "LOOPD_SANDBOX", "LOOPD_CONFIG", "KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOOPD_SANDBOX", "none")


def test_the_file_then_the_environment_then_the_flags(tmp_path: Path) -> None:
    config = tmp_path / "loopd.yaml"
    config.write_text(FILE)
    from_file = server_settings(read_config(config, env={}))
    assert (from_file.port, from_file.api_port, from_file.data_dir) == (9001, 9002, tmp_path / "state")
    assert (from_file.engine_capacity, from_file.task_workers, from_file.call_timeout, from_file.lease_ttl) == (
        7,
        3,
        120.0,
        12.0,
    )
    assert (from_file.kube_api, from_file.namespace) == ("embedded", "team")

    env = {"LOOPD_PORT": "9101", "LOOPD_NAMESPACE": "other"}
    from_env = server_settings(read_config(config, env=env))
    assert (from_env.port, from_env.namespace) == (9101, "other")

    from_flags = server_settings(read_config(config, env=env), port=9201, namespace="flagged")
    assert (from_flags.port, from_flags.namespace) == (9201, "flagged")


def test_defaults_without_a_file(tmp_path: Path) -> None:
    settings = server_settings(read_config(None, env={}), data_dir=tmp_path / "d")
    assert (settings.host, settings.port, settings.api_port, settings.kube_api) == ("127.0.0.1", 8420, 0, "embedded")
    assert settings.namespace == "default" and settings.harnesses is None and settings.holder == "loopd server"


def test_loopd_up_refuses_a_cluster(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    with pytest.raises(CliError, match="loopd up keeps its Tasks in the embedded store"):
        server_settings(read_config(None, env={}), kubeconfig=kubeconfig, embedded_only=True)


def test_where_tasks_live(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    assert resolve_kube_api("auto", None, env={}) == "embedded"
    assert resolve_kube_api("auto", kubeconfig, env={}) == "kubeconfig"
    assert resolve_kube_api("embedded", kubeconfig, env={}) == "embedded"
    with pytest.raises(ServerSetupError, match="no kubeconfig file"):
        resolve_kube_api("kubeconfig", None, env={})
    with pytest.raises(ServerSetupError, match="not a pod"):
        resolve_kube_api("in-cluster", None, env={})
    assert resolve_namespace(None, "embedded") == "default"
    assert resolve_namespace("team", "in-cluster") == "team"
