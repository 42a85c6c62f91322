"""Reading a configuration file: YAML with line numbers, the ``LOOPD_*`` overrides, the JSON schema, then values.

1. The text is composed into PyYAML nodes (never constructed blindly), so every value keeps its line and column;
   duplicate keys are refused.
2. The environment overrides (`ENV_OVERRIDES`) replace the file's values before validation, so a bad
   ``LOOPD_PORT`` is reported like a bad ``listen.port`` (its location is the variable's name).
3. The data is validated against ``schema.json`` (committed beside this module, draft 2020-12) with ``jsonschema``;
   every error becomes one `ConfigProblem` at the line of the value it is about (an unknown key: at the key).
4. What the schema cannot say is checked next, at the same precision: harness keys are unique, a gate policy file
   reads and parses.

All problems are collected and raised together as `ConfigError` (``problems``, one line each, in file order).
Relative paths in the file are relative to the file's directory.
Must not do: open databases, sockets or models (the composition root does).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Final, cast

import yaml
from pydantic import SecretStr

from loopd.harness.gate import GatePolicyError, load_policy
from loopd.server._errors import ServerSetupError
from loopd.server.ledger import parse_duration
from loopd.server.storage import InvalidRecord

from ._types import (
    ActorToken,
    BuiltinHarness,
    ForeignHarness,
    HarnessTarget,
    KubeApi,
    ModelHarness,
    ModelSpec,
    RemoteHarness,
    ServerConfig,
)

MAX_CONFIG_BYTES: Final = 1_048_576
CONFIG_ENV: Final = "LOOPD_CONFIG"

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class EnvOverride:
    """``LOOPD_<NAME>`` replaces the value at ``path`` (a string from the environment, converted to ``kind``)."""

    name: str
    path: tuple[str, ...]
    kind: str  # "string" | "integer" | "number" | "boolean"
    help: str


ENV_OVERRIDES: Final[tuple[EnvOverride, ...]] = (
    EnvOverride("LOOPD_DATA_DIR", ("data_dir",), "string", "where the server keeps its local state"),
    EnvOverride("LOOPD_WORKSPACES", ("workspaces",), "string", "the built-in harnesses' workspaces root"),
    EnvOverride("LOOPD_HOST", ("listen", "host"), "string", "address to listen on"),
    EnvOverride("LOOPD_PORT", ("listen", "port"), "integer", "port of the HTTP API and web UI"),
    EnvOverride("LOOPD_API_PORT", ("listen", "api_port"), "integer", "port of the embedded Kubernetes API"),
    EnvOverride("LOOPD_PUBLIC", ("listen", "public"), "boolean", "allow a non-loopback host"),
    EnvOverride("LOOPD_DATABASE_URL", ("database", "url"), "string", "PostgreSQL DSN of the server state"),
    EnvOverride("LOOPD_KUBE_API", ("kubernetes", "api"), "string", "auto, embedded, in-cluster or kubeconfig"),
    EnvOverride("LOOPD_KUBECONFIG", ("kubernetes", "kubeconfig"), "string", "kubeconfig file of the Task API"),
    EnvOverride("LOOPD_NAMESPACE", ("kubernetes", "namespace"), "string", "namespace of the Tasks"),
    EnvOverride("LOOPD_HARNESS_CALLS", ("capacity", "harness_calls"), "integer", "harness calls at once"),
    EnvOverride("LOOPD_TASK_WORKERS", ("capacity", "task_workers"), "integer", "Tasks reconciled at once"),
    EnvOverride("LOOPD_CALL_TIMEOUT", ("timeouts", "harness_call"), "number", "seconds one Task's call may take"),
    EnvOverride("LOOPD_LEASE_TTL", ("timeouts", "lease_ttl"), "number", "seconds a replica's call lease lasts"),
    EnvOverride("LOOPD_LEDGER_RETENTION", ("ledger", "retention"), "string", "how long the ledger keeps prompts"),
    EnvOverride("LOOPD_LEDGER_PROMPTS", ("ledger", "prompts"), "boolean", "store full prompts in the ledger"),
)
ADMIN_TOKEN_ENV: Final = "LOOPD_ADMIN_TOKEN"
"""An extra admin bearer token (besides the generated one), unless ``auth.admin_token_env`` names another."""


@dataclass(frozen=True, order=True)
class ConfigProblem:
    """One thing wrong with a configuration, where it is."""

    line: int
    column: int
    path: str
    message: str
    source: str = ""

    def render(self) -> str:
        """``file:line:col: path: message`` (``$LOOPD_X: path: message`` for an environment override)."""
        where = self.source if self.line <= 0 else f"{self.source}:{self.line}:{self.column}"
        message = " ".join(self.message.split())  # one line, whatever the message held
        return f"{where}: {self.path}: {message}" if self.path else f"{where}: {message}"


class ConfigError(ServerSetupError):
    """A configuration file (or an override) that is unreadable or invalid; ``problems`` says each, one line."""

    def __init__(self, problems: Iterable[ConfigProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(problem.render() for problem in self.problems) or "invalid configuration")

    def lines(self) -> list[str]:
        return [problem.render() for problem in self.problems]


@cache
def config_schema() -> dict[str, Any]:
    """The JSON schema of the configuration file (``loopd/server/config/schema.json``)."""
    text = resources.files(__package__).joinpath("schema.json").read_text(encoding="utf-8")
    schema = json.loads(text)
    if not isinstance(schema, dict):  # pragma: no cover - the committed file is an object
        raise TypeError("schema.json is not a JSON object")
    return schema


class _Marks:
    """Where each value (and each mapping key) sits in the file."""

    def __init__(self) -> None:
        self.values: dict[Path_, tuple[int, int]] = {}
        self.keys: dict[Path_, tuple[int, int]] = {}
        self.env: dict[Path_, str] = {}

    def at(self, path: Path_, *, key: bool = False) -> tuple[int, int]:
        for depth in range(len(path), -1, -1):
            prefix = path[:depth]
            found = (self.keys.get(prefix) if key and depth == len(path) else None) or self.values.get(prefix)
            if found is not None:
                return found
        return (1, 1)


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _build(node: yaml.Node, path: Path_, marks: _Marks, problems: list[ConfigProblem], source: str) -> Any:
    marks.values[path] = _mark(node)
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                line, column = _mark(key_node)
                problems.append(ConfigProblem(line, column, _render(path), "a key must be a plain string", source))
                continue
            key = str(key_node.value)
            if key in out:
                line, column = _mark(key_node)
                problems.append(ConfigProblem(line, column, _render((*path, key)), "duplicate key", source))
                continue
            marks.keys[(*path, key)] = _mark(key_node)
            out[key] = _build(value_node, (*path, key), marks, problems, source)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, (*path, index), marks, problems, source) for index, item in enumerate(node.value)]
    return yaml.SafeLoader("").construct_object(node, deep=True)


def _render(path: Iterable[str | int]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _convert(raw: str, kind: str) -> Any:
    text = raw.strip()
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            return float(text)
    except ValueError:
        return raw  # the schema says what is wrong with it
    if kind == "boolean":
        lowered = text.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off", ""):
            return False
    return raw


def _apply_env(data: dict[str, Any], env: Mapping[str, str], marks: _Marks) -> None:
    for override in ENV_OVERRIDES:
        raw = env.get(override.name)
        if raw is None or (raw == "" and override.kind != "boolean"):
            continue
        target = data
        for part in override.path[:-1]:
            child = target.get(part)
            if not isinstance(child, dict):
                child = target[part] = {}
            target = child
        target[override.path[-1]] = _convert(raw, override.kind)
        if override.path == ("database", "url"):
            target.pop("url_env", None)  # the variable wins over the file's url_env too
        marks.env[override.path] = override.name


def _schema_problems(data: Any, marks: _Marks, source: str) -> list[ConfigProblem]:
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(config_schema())
    found: list[ConfigProblem] = []
    for error in validator.iter_errors(data):
        for path, message, at_key in _explain(error):
            found.append(_problem(path, message, marks, source, at_key=at_key))
    return found


def _explain(error: Any) -> list[tuple[Path_, str, bool]]:
    """``(path, message, at the key?)`` for one jsonschema error (several for unknown keys, one each)."""
    path: Path_ = tuple(error.absolute_path)
    validator, instance = error.validator, error.instance
    if validator in ("if", "allOf", "anyOf", "oneOf") and error.context:
        explained: list[tuple[Path_, str, bool]] = []
        for sub in error.context:
            explained += _explain(sub)
        return explained
    if validator == "additionalProperties" and isinstance(instance, dict):
        allowed = sorted(error.schema.get("properties") or {})
        unknown = [key for key in instance if key not in allowed]
        hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return [((*path, key), f"unknown key{hint}", True) for key in unknown]
    if validator == "required" and isinstance(instance, dict):
        missing = [key for key in error.validator_value if key not in instance]
        return [(path, f"missing required key {key!r}", False) for key in missing]
    if validator == "not" and isinstance(error.validator_value, dict) and "required" in error.validator_value:
        keys = " and ".join(error.validator_value["required"])
        return [(path, f"give only one of {keys}", False)]
    if validator == "pattern" and path == ("database", "url"):
        return [(path, "must be a PostgreSQL DSN (postgresql://user@host:port/database)", False)]  # never echoed
    if validator == "pattern":
        return [(path, f"{instance!r} does not match {error.validator_value}", False)]
    if validator == "enum":
        choices = ", ".join(str(choice) for choice in error.validator_value)
        return [(path, f"{instance!r} is not one of: {choices}", False)]
    if validator == "type":
        return [(path, f"{instance!r} is not of type {error.validator_value}", False)]
    return [(path, str(error.message), False)]


def _problem(path: Path_, message: str, marks: _Marks, source: str, *, at_key: bool = False) -> ConfigProblem:
    for depth in range(len(path), 0, -1):
        variable = marks.env.get(cast(tuple[str, ...], path[:depth]))
        if variable is not None:
            return ConfigProblem(0, 0, _render(path), message, f"${variable}")
    line, column = marks.at(path, key=at_key)
    return ConfigProblem(line, column, _render(path), message, source)


def parse_config(
    text: str,
    *,
    source: str = "<config>",
    base_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
    resolve_secrets: bool = True,
) -> ServerConfig:
    """The `ServerConfig` of ``text`` (YAML) with the ``LOOPD_*`` overrides of ``env`` (default: the process's).

    ``resolve_secrets``: read the variables the file names for secrets (``database.url_env``,
    ``auth.admin_token_env``) now; a missing one is a problem. `ConfigError` lists every problem found.
    """
    source_env = os.environ if env is None else env
    base = base_dir if base_dir is not None else Path.cwd()
    problems: list[ConfigProblem] = []
    marks = _Marks()
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        reason = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([ConfigProblem(line, column, "", f"not valid YAML: {reason}", source)]) from exc
    data: Any = {} if node is None else _build(node, (), marks, problems, source)
    if not isinstance(data, dict):
        line, column = marks.at(())
        problems.append(ConfigProblem(line, column, "", "the configuration must be a mapping of keys", source))
        raise ConfigError(problems)
    _apply_env(data, source_env, marks)
    problems += _schema_problems(data, marks, source)
    if problems:
        raise ConfigError(sorted(set(problems)))
    config = _values(data, base, marks, problems, source, source_env, resolve_secrets=resolve_secrets)
    if problems:
        raise ConfigError(sorted(set(problems)))
    return config


def load_config(
    path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None, resolve_secrets: bool = True
) -> ServerConfig:
    """`parse_config` of the file at ``path`` (at most 1 MiB, UTF-8); an unreadable file is a `ConfigError` too."""
    file = Path(path).expanduser()
    shown = str(path)
    try:
        with open(file, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError([ConfigProblem(0, 0, "", f"cannot read it: {exc.strerror or exc}", shown)]) from exc
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError([ConfigProblem(0, 0, "", f"larger than {MAX_CONFIG_BYTES} bytes", shown)])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([ConfigProblem(0, 0, "", "not UTF-8 text", shown)]) from exc
    return parse_config(text, source=shown, base_dir=file.resolve().parent, env=env, resolve_secrets=resolve_secrets)


def config_from_env(*, env: Mapping[str, str] | None = None, resolve_secrets: bool = True) -> ServerConfig:
    """The configuration of the ``LOOPD_*`` overrides alone (no file)."""
    return parse_config("{}", source="<environment>", env=env, resolve_secrets=resolve_secrets)


# --- values ---------------------------------------------------------------------------------------------------


def _values(
    data: dict[str, Any],
    base: Path,
    marks: _Marks,
    problems: list[ConfigProblem],
    source: str,
    env: Mapping[str, str],
    *,
    resolve_secrets: bool,
) -> ServerConfig:
    def path_of(value: Any) -> Path | None:
        if value is None:
            return None
        candidate = Path(str(value)).expanduser()
        return candidate if candidate.is_absolute() else base / candidate

    listen = data.get("listen") or {}
    database = data.get("database") or {}
    kube = data.get("kubernetes") or {}
    capacity = data.get("capacity") or {}
    timeouts = data.get("timeouts") or {}
    auth = data.get("auth") or {}
    ledger = data.get("ledger") or {}
    redact: list[str] = []
    for index, pattern in enumerate(ledger.get("redact") or ()):
        try:
            re.compile(pattern)
        except re.error as exc:
            problems.append(_problem(("ledger", "redact", index), f"not a regular expression: {exc}", marks, source))
            continue
        redact.append(str(pattern))
    retention: float | None = None
    if ledger.get("retention") is not None:
        try:
            retention = parse_duration(str(ledger["retention"]))
        except InvalidRecord as exc:
            problems.append(_problem(("ledger", "retention"), str(exc), marks, source))

    database_url = database.get("url")
    if database.get("url_env") and resolve_secrets:
        name = database["url_env"]
        database_url = env.get(name, "").strip() or None
        if database_url is None:
            problems.append(_problem(("database", "url_env"), f"${name} is not set", marks, source))
    admin_name = auth.get("admin_token_env") or ADMIN_TOKEN_ENV
    admin_token: SecretStr | None = None
    if resolve_secrets:
        raw_token = env.get(admin_name, "").strip()
        if raw_token:
            admin_token = SecretStr(raw_token)
        elif auth.get("admin_token_env"):
            problems.append(_problem(("auth", "admin_token_env"), f"${admin_name} is not set", marks, source))

    harnesses: tuple[HarnessTarget, ...] | None = None
    if "harnesses" in data:
        seen: dict[str, int] = {}
        built: list[HarnessTarget] = []
        for index, item in enumerate(data["harnesses"]):
            key = str(item["key"])
            if key in seen:
                problems.append(
                    _problem(
                        (("harnesses", index, "key")),
                        f"duplicate key {key!r} (also harnesses[{seen[key]}])",
                        marks,
                        source,
                    )
                )
                continue
            seen[key] = index
            target = _harness(item, index, path_of, marks, problems, source)
            if target is not None:
                built.append(target)
        harnesses = tuple(built)

    return ServerConfig(
        source=source,
        data_dir=path_of(data.get("data_dir")),
        workspaces=path_of(data.get("workspaces")),
        host=listen.get("host"),
        port=listen.get("port"),
        api_port=listen.get("api_port"),
        public=listen.get("public"),
        database_url=database_url,
        kube_api=cast(KubeApi, kube.get("api", "auto")),
        kubeconfig=path_of(kube.get("kubeconfig")),
        namespace=kube.get("namespace"),
        kube_timeout=float(kube.get("request_timeout", 10.0)),
        harness_calls=capacity.get("harness_calls"),
        task_workers=int(capacity.get("task_workers", 8)),
        call_timeout=_float(timeouts.get("harness_call")),
        lease_ttl=_float(timeouts.get("lease_ttl")),
        admin_token=admin_token,
        actor_tokens=tuple(
            ActorToken(str(item["actor"]), item.get("token_env"), path_of(item.get("token_file")))
            for item in auth.get("actor_tokens") or ()
        ),
        harnesses=harnesses,
        ledger_prompts=bool(ledger.get("prompts", True)),
        ledger_retention=retention,
        ledger_redact=tuple(redact),
    )


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _model(data: Any) -> ModelSpec | None:
    if not isinstance(data, dict):
        return None
    return ModelSpec(
        name=str(data["name"]),
        base_url=data.get("base_url"),
        api_key_env=data.get("api_key_env"),
        timeout=_float(data.get("timeout")),
        max_retries=data.get("max_retries"),
        rate_limits=data.get("rate_limits"),
    )


def _harness(
    item: dict[str, Any],
    index: int,
    path_of: Any,
    marks: _Marks,
    problems: list[ConfigProblem],
    source: str,
) -> HarnessTarget | None:
    common = {"key": str(item["key"]), "title": item.get("title", ""), "description": item.get("description", "")}
    kind = item["kind"]
    if kind == "remote":
        return RemoteHarness(
            url=str(item["url"]),
            token_env=item.get("token_env"),
            token_file=path_of(item.get("token_file")),
            timeout=_float(item.get("timeout")),
            **common,
        )
    if kind == "model":
        model = _model(item["model"])
        assert model is not None  # the schema requires the mapping
        return ModelHarness(
            model=model,
            system_prompt=item.get("system_prompt"),
            max_output_tokens=item.get("max_output_tokens"),
            **common,
        )
    policy_path = path_of(item.get("policy"))
    policy = None
    if policy_path is not None:
        try:
            policy = load_policy(policy_path)
        except GatePolicyError as exc:
            problems.append(_problem(("harnesses", index, "policy"), str(exc), marks, source))
            return None
    if kind == "foreign":
        return ForeignHarness(
            engine=item["engine"],
            command=tuple(str(part) for part in item.get("command") or ()),
            workspace=path_of(item.get("workspace")),
            policy=policy,
            policy_path=policy_path,
            **common,
        )
    tools = item.get("tools")
    mcp_servers: tuple[Any, ...] = ()
    if "mcpServers" in item:
        from loopd.harness.tools import McpConfigError, parse_mcp_servers  # the MCP SDK: only when configured

        try:
            mcp_servers = parse_mcp_servers(
                {"mcpServers": item["mcpServers"]}, source=f"harnesses[{index}]", base_dir=path_of(".")
            )
        except McpConfigError as exc:
            problems.append(_problem(("harnesses", index, "mcpServers"), str(exc), marks, source))
            return None
    return BuiltinHarness(
        model=_model(item.get("model")),
        tools=tuple(tools) if tools is not None else None,
        workspace=path_of(item.get("workspace")),
        policy=policy,
        policy_path=policy_path,
        system_prompt=item.get("system_prompt"),
        max_steps=item.get("max_steps"),
        mode=item.get("mode"),
        snapshots=item.get("snapshots") or "off",
        compact_at_tokens=item.get("compact_at_tokens"),
        continue_conversations=item.get("continue_conversations", True),
        mcp_servers=mcp_servers,
        **common,
    )
