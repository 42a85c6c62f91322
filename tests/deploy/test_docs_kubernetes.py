"""docs/KUBERNETES.md's examples work: its values files and its helm commands render with the real chart."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from tests.deploy.chart import CHART, ROOT, Objects, render, template, value_sets

DOC = ROOT / "docs" / "KUBERNETES.md"
_BLOCK = re.compile(r"^( *)```(\w+)\n(.*?)^\1```", re.S | re.M)


def _blocks(language: str) -> list[str]:
    text = DOC.read_text()
    found = []
    for match in _BLOCK.finditer(text):
        if match.group(2) == language:
            indent = len(match.group(1))
            found.append("\n".join(line[indent:] for line in match.group(3).splitlines()))
    return found


def _values_blocks() -> dict[str, str]:
    blocks = {}
    for block in _blocks("yaml"):
        first = block.splitlines()[0]
        if first.startswith("# values: "):
            blocks[first.removeprefix("# values: ").strip()] = block
    return blocks


def _helm_commands() -> list[list[str]]:
    """Every ``helm install|upgrade`` command of the bash blocks, as arguments (continuation lines joined)."""
    commands = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:2] in (["helm", "install"], ["helm", "upgrade"]):
                commands.append(words)
    return commands


def test_the_doc_has_its_examples() -> None:
    assert set(_values_blocks()) == {"production", "autoscaling", "harnesses", "server-only"}
    assert len(_helm_commands()) == 2
    assert "```mermaid" in DOC.read_text()


@pytest.mark.parametrize("name", sorted(_values_blocks()))
def test_each_values_example_renders(name: str, tmp_path: Path) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(_values_blocks()[name])
    objects = render(path)
    assert "loopd-server" in objects.names("Deployment")
    if name == "production":
        assert objects.get("Deployment", "loopd-server")["spec"]["replicas"] == 3
        assert objects.get("Ingress", "loopd")["spec"]["tls"][0]["secretName"] == "loopd-tls"
    if name == "server-only":
        assert objects.names("Deployment") == {"loopd-server"}


def _template_flags(words: list[str], tmp_path: Path) -> list[str]:
    """The ``helm template`` flags that render what ``helm install|upgrade`` ``words`` would install."""
    flags: list[str] = []
    rest = iter(words[2:])
    for word in rest:
        if word == str(CHART.relative_to(ROOT)) or word in ("loopd", "--install", "--reuse-values"):
            continue
        if word == "-f":
            flags += ["-f", str(tmp_path / next(rest))]
        elif word in ("--namespace", "--set"):
            flags += [word, next(rest)]
        else:
            raise AssertionError(f"the test does not know {word!r} of {' '.join(words)}")
    return flags


def test_each_helm_command_renders(tmp_path: Path) -> None:
    (tmp_path / "production.yaml").write_text(_values_blocks()["production"])
    for words in _helm_commands():
        run = template(extra=_template_flags(words, tmp_path))
        assert run.code == 0, f"{' '.join(words)}:\n{run.stderr}"


def test_the_quick_start_takes_the_model_key_from_its_secret(tmp_path: Path) -> None:
    (install,) = [words for words in _helm_commands() if words[1] == "install"]
    run = template(extra=_template_flags(install, tmp_path))
    assert run.code == 0, run.stderr
    objects = Objects([doc for doc in yaml.safe_load_all(run.stdout) if doc])
    (container,) = objects.get("Deployment", "loopd-server")["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}
    assert env["OPENAI_API_KEY"] == {"secretKeyRef": {"name": "model-api-key", "key": "api-key"}}
    assert env["LOOPD_MODEL"] == "gpt-4o-mini"
    assert container["image"] == "registry.example.com/loopd:0.1.0"


def test_the_security_table_names_every_service_account() -> None:
    text = DOC.read_text()
    for name in ("loopd-server", "loopd-router", "loopd-longhorizon"):
        assert f"| `{name}` |" in text
    assert value_sets()  # the value sets the dry run uses exist


def test_the_values_table_names_every_top_level_key() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    table = DOC.read_text().split("## Values", 1)[1].split("\n## ", 1)[0]
    for key in values:
        assert f"`{key}" in table, key
