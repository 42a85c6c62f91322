"""docs/configuration.md against the real configuration loader and schema: every YAML example validates, every key
of the schema and every environment override is documented, and the documented defaults are the loader's."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopd.server.config import ENV_OVERRIDES, BuiltinHarness, ModelHarness, RemoteHarness, config_schema, parse_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _yaml_blocks() -> list[str]:
    return _BLOCK.findall(DOC.read_text())


def _keys(schema: dict[str, Any], prefix: str, defs: dict[str, Any]) -> Iterator[str]:
    """Every key path of ``schema``: ``listen.port``, ``harnesses[].model.name``, … (``[]``: an array's items)."""
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    if isinstance(schema.get("items"), dict):
        yield from _keys(schema["items"], f"{prefix.removesuffix('.')}[].", defs)
    for name, sub in (schema.get("properties") or {}).items():
        yield f"{prefix}{name}"
        if isinstance(sub, dict):
            yield from _keys(sub, f"{prefix}{name}.", defs)
    for part in schema.get("allOf") or ():
        yield from _keys(part.get("then") or {}, prefix, defs)


def test_the_doc_has_yaml_examples() -> None:
    assert len(_yaml_blocks()) >= 3


@pytest.mark.parametrize("index", range(len(_yaml_blocks())))
def test_every_yaml_example_validates(index: int, tmp_path: Path) -> None:
    text = _yaml_blocks()[index]
    config = parse_config(text, source=f"{DOC.name} example {index}", base_dir=tmp_path, env={}, resolve_secrets=False)
    assert config.source is not None


def test_the_complete_example_has_one_target_of_each_kind(tmp_path: Path) -> None:
    complete = next(block for block in _yaml_blocks() if "kind: remote" in block)
    config = parse_config(complete, base_dir=tmp_path, env={}, resolve_secrets=False)
    assert config.harnesses is not None
    assert [type(target) for target in config.harnesses] == [BuiltinHarness, RemoteHarness, ModelHarness]
    assert config.kube_api == "auto" and config.namespace == "loopd" and config.harness_calls == 40


def test_every_schema_key_is_documented() -> None:
    schema = config_schema()
    text = DOC.read_text()
    missing = []
    for key in _keys(schema, "", schema["$defs"]):
        # A model's keys are documented once, as model.<key>, for every harness kind that has one.
        shown = key.replace("harnesses[].model.", "model.")
        if f"`{shown}`" not in text:
            missing.append(key)
    assert not missing, f"keys of schema.json not documented in {DOC.name}: {missing}"


def test_every_environment_override_is_documented_with_its_key() -> None:
    text = DOC.read_text()
    for override in ENV_OVERRIDES:
        row = f"| `{override.name}` | `{'.'.join(override.path)}`"
        assert row in text, f"{override.name} is not documented as {'.'.join(override.path)}"


def test_the_documented_defaults_are_the_loaders() -> None:
    config = parse_config("{}", env={}, resolve_secrets=False)
    assert (config.kube_api, config.namespace, config.kube_timeout, config.task_workers) == ("auto", None, 10, 8)
    assert config.harnesses is None and config.port is None  # the server's own defaults apply (8420, …)


def test_loopd_database_url_wins_over_the_files_url_env(tmp_path: Path) -> None:
    text = "database:\n  url_env: SOME_DSN\n"
    env = {"LOOPD_DATABASE_URL": "postgresql://u@h/db", "SOME_DSN": "postgresql://other@h/db"}
    assert parse_config(text, base_dir=tmp_path, env=env).database_url == "postgresql://u@h/db"
    assert parse_config(text, base_dir=tmp_path, env={"SOME_DSN": "postgresql://x@h/d"}).database_url == (
        "postgresql://x@h/d"
    )
