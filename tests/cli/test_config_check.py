"""`loopd config check FILE`, and `loopd server` / `loopd up` refusing a bad configuration: one line per problem,
``file:line:col: key: message``, exit 2, no traceback."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import child_env, loopd

BAD = """\
listen:
  host: 127.0.0.1
  port: 99999
  colour: blue
kubernetes:
  api: cloud
harnesses:
  - key: assistant
    kind: builtin
    tools: [read_file, rm]
  - key: gpt
    kind: model
  - key: reviewer
    kind: remote
    url: ftp://reviewer
"""


def test_check_reports_every_problem_on_its_own_line_with_its_position(tmp_path: Path) -> None:
    config = tmp_path / "loopd.yaml"
    config.write_text(BAD)
    done = loopd(["config", "check", str(config)], env=child_env(tmp_path / "data"))
    assert done.code == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.error_lines == [
        f"{config}:3:9: listen.port: 99999 is greater than the maximum of 65535",
        f"{config}:4:3: listen.colour: unknown key (allowed: api_port, host, port, public)",
        f"{config}:6:8: kubernetes.api: 'cloud' is not one of: auto, embedded, in-cluster, kubeconfig",
        f"{config}:10:24: harnesses[0].tools[1]: 'rm' is not one of: read_file, list_dir, glob, grep, write_file, "
        "edit_file, bash",
        f"{config}:11:5: harnesses[1]: missing required key 'model'",
        f"{config}:15:10: harnesses[2].url: 'ftp://reviewer' does not match ^https?://",
    ]


def test_a_single_bad_value_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "one.yaml"
    config.write_text("capacity:\n  harness_calls: many\n")
    line = loopd(["config", "check", str(config)], env=child_env(tmp_path / "data")).one_line_error(2)
    assert line == f"{config}:2:18: capacity.harness_calls: 'many' is not of type integer"


def test_yaml_syntax_duplicate_keys_and_policy_files_are_located(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("listen:\n  port: 1\n  host: [oops\n")
    line = loopd(["config", "check", str(broken)], env=child_env(tmp_path / "data")).one_line_error(2)
    assert line.startswith(f"{broken}:4:1: not valid YAML"), line

    twice = tmp_path / "twice.yaml"
    twice.write_text("harnesses:\n  - {key: a, kind: builtin}\n  - key: a\n    kind: builtin\n")
    line = loopd(["config", "check", str(twice)], env=child_env(tmp_path / "data")).one_line_error(2)
    assert line == f"{twice}:3:10: harnesses[1].key: duplicate key 'a' (also harnesses[0])"

    policy = tmp_path / "policy.yaml"
    policy.write_text("rules: [1, 2\n")
    with_policy = tmp_path / "policy-ref.yaml"
    with_policy.write_text("harnesses:\n  - key: a\n    kind: builtin\n    policy: policy.yaml\n")
    line = loopd(["config", "check", str(with_policy)], env=child_env(tmp_path / "data")).one_line_error(2)
    assert line.startswith(f"{with_policy}:4:13: harnesses[0].policy: {policy}: not valid YAML/JSON"), line


def test_environment_overrides_are_validated_like_the_keys_they_replace(tmp_path: Path) -> None:
    config = tmp_path / "ok.yaml"
    config.write_text("listen: {port: 8421}\n")
    env = child_env(tmp_path / "data", LOOPD_PORT="eighty")
    line = loopd(["config", "check", str(config)], env=env).one_line_error(2)
    assert line == "$LOOPD_PORT: listen.port: 'eighty' is not of type integer"


def test_a_valid_file_is_ok(tmp_path: Path) -> None:
    config = tmp_path / "good.yaml"
    config.write_text(
        "listen: {port: 0}\n"
        "harnesses:\n"
        "  - {key: assistant, kind: builtin, tools: [read_file, grep]}\n"
        "  - {key: gpt, kind: model, model: {name: gpt-4o-mini, api_key_env: MISSING_AT_CHECK_TIME}}\n"
    )
    done = loopd(["config", "check", str(config)], env=child_env(tmp_path / "data"))
    assert done.code == 0, done.stderr
    assert done.stdout.strip() == f"{config}: ok (2 harness target(s))"


def test_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    line = loopd(["config", "check", str(missing)], env=child_env(tmp_path / "data")).one_line_error(2)
    assert line == f"{missing}: cannot read it: No such file or directory"


def test_server_and_up_refuse_a_bad_file_before_starting(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("listen:\n  port: -1\n")
    for command in ("server", "up"):
        done = loopd([command, "--config", str(config), "--data-dir", str(tmp_path / command)], env=child_env(tmp_path))
        line = done.one_line_error(2)
        assert line == f"{config}:2:9: listen.port: -1 is less than the minimum of 0"
        assert not (tmp_path / command).exists()  # nothing started


def test_a_secret_variable_the_file_names_must_be_set_when_the_server_starts(tmp_path: Path) -> None:
    config = tmp_path / "secret.yaml"
    config.write_text("database:\n  url_env: LOOPD_TEST_PG_DSN\n")
    assert loopd(["config", "check", str(config)], env=child_env(tmp_path)).code == 0  # not read when checking
    done = loopd(["server", "--config", str(config), "--data-dir", str(tmp_path / "d")], env=child_env(tmp_path))
    line = done.one_line_error(2)
    assert line == f"{config}:2:12: database.url_env: $LOOPD_TEST_PG_DSN is not set"


def test_loopd_up_keeps_its_tasks_embedded(tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text("kubernetes: {api: in-cluster}\n")
    done = loopd(["up", "--config", str(config), "--data-dir", str(tmp_path / "d")], env=child_env(tmp_path))
    line = done.one_line_error(2)
    assert "loopd up keeps its Tasks in the embedded store" in line and "loopd server" in line, line


def test_server_in_cluster_outside_a_pod_is_one_line(tmp_path: Path) -> None:
    env = child_env(tmp_path, LOOPD_KUBE_API="in-cluster")
    env.pop("KUBERNETES_SERVICE_HOST", None)
    line = loopd(["server", "--data-dir", str(tmp_path / "d")], env=env).one_line_error(2)
    assert "in-cluster but this is not a pod" in line, line
