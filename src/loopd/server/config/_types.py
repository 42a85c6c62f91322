"""The typed result of a loaded configuration file: `ServerConfig` and its harness targets.

Every field that the file (or the environment) leaves out is None (or the documented default), so the command line
can tell "not configured" from a value and apply its own precedence. Secrets are never stored here: only the names
of the environment variables (or files) that hold them, read when the server starts.
Must not do: I/O (``_loader`` reads and validates; the composition root opens things).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from pydantic import SecretStr

from loopd._infra.errors import LoopdError
from loopd.harness.gate import GatePolicy
from loopd.harness.models import ModelConfig
from loopd.harness.snapshots import SnapshotTrigger

if TYPE_CHECKING:
    from loopd.harness.tools import McpServer

KubeApi = Literal["auto", "embedded", "in-cluster", "kubeconfig"]
KUBE_APIS: Final[tuple[KubeApi, ...]] = ("auto", "embedded", "in-cluster", "kubeconfig")


class MissingSecret(LoopdError, ValueError):
    """An environment variable or file the configuration names for a secret is not there."""


@dataclass(frozen=True)
class ModelSpec:
    """``model:`` of a harness: the model id (or a fallback chain ``a,b``), its endpoint, the variable holding the key,
    and per-provider rate limits.

    ``base_url`` and ``api_key_env`` belong to the chain's *first* provider; any other provider of the chain reads its
    standard variables (``OPENAI_API_KEY`` / ``OPENAI_BASE_URL``, ``ANTHROPIC_API_KEY`` / ``ANTHROPIC_BASE_URL``).
    """

    name: str
    base_url: str | None = None
    api_key_env: str | None = None
    timeout: float | None = None
    max_retries: int | None = None
    rate_limits: Mapping[str, Mapping[str, float]] | None = None
    """``{provider: {rpm, tpm, max_queue}}``; None: ``LOOPD_RATE_LIMITS`` of the process."""

    def resolve(self, env: Mapping[str, str] | None = None) -> ModelConfig:
        """The `ModelConfig` (the key read from ``api_key_env`` now); `MissingSecret` when that variable is unset —
        unless the process replays a model cassette (``LOOPD_MODEL_CASSETTE`` in mode ``replay``): a replay never
        reaches the provider, so it needs no key (``record`` and ``auto`` may reach it, so they still do)."""
        source = os.environ if env is None else env
        base = ModelConfig.from_env(source, model=self.name)
        replaying = base.cassette is not None and base.cassette.mode == "replay"
        key: SecretStr | None = None
        if self.api_key_env is not None:
            value = source.get(self.api_key_env, "").strip()
            if value:
                key = SecretStr(value)
            elif not replaying:
                raise MissingSecret(
                    f"model {self.name}: ${self.api_key_env} (its api_key_env) is not set (only a cassette replay, "
                    "LOOPD_MODEL_CASSETTE_MODE=replay, runs without it)"
                )
        first = base.chain()[0].provider if not base.is_demo else "openai"
        values: dict[str, object] = base.model_dump()
        values.update({"prices_path": None})
        if first == "anthropic":
            values.update({"anthropic_base_url": self.base_url, "anthropic_api_key": key})
            values.update({"base_url": base.base_url, "api_key": base.api_key})
        else:
            values.update({"base_url": self.base_url, "api_key": key})
        if self.timeout is not None:
            values["timeout"] = self.timeout
        if self.max_retries is not None:
            values["max_retries"] = self.max_retries
        if self.rate_limits is not None:
            values["rate_limits"] = {provider: dict(limit) for provider, limit in self.rate_limits.items()}
        return ModelConfig.model_validate(values)


@dataclass(frozen=True)
class BuiltinHarness:
    """A built-in harness rig in this process: loopd's own agent loop with file and bash tools."""

    key: str
    title: str = ""
    description: str = ""
    model: ModelSpec | None = None
    """None: the process's model (``--model`` / ``LOOPD_MODEL`` / ``OPENAI_*``)."""
    tools: tuple[str, ...] | None = None
    """None: every built-in tool."""
    workspace: Path | None = None
    """None: ``<workspaces>/<key>``."""
    policy: GatePolicy | None = None
    policy_path: Path | None = None
    system_prompt: str | None = None
    max_steps: int | None = None
    mode: str | None = None
    """The mode its sessions start in: ``build`` (every tool; None) or ``plan`` (read-only tools only)."""
    mcp_servers: tuple[McpServer, ...] = ()
    """``mcpServers``: MCP servers whose tools this harness offers (through its gate)."""
    snapshots: SnapshotTrigger = "off"
    """When its sessions snapshot the workspace (``turn_done``, ``step_done``, ``idle``, ``off``): with snapshots, a
    retry / edit fork of a conversation puts the workspace back to the files the retried turn found."""
    compact_at_tokens: int | None = None
    """Past this estimated context (tokens) a session summarizes its oldest messages before the next model call
    (None: the standard rig's 100,000); set it below the model's context window."""
    continue_conversations: bool = True
    """A later question in a conversation goes on from the session of this harness's last answer there (False: each
    question starts a new session, given the conversation's last messages as text)."""
    kind: Literal["builtin"] = "builtin"


@dataclass(frozen=True)
class RemoteHarness:
    """A harness behind ``loopd harness serve`` (or a service speaking its HTTP API)."""

    key: str
    url: str
    title: str = ""
    description: str = ""
    token_env: str | None = None
    token_file: Path | None = None
    timeout: float | None = None
    kind: Literal["remote"] = "remote"

    def token(self, env: Mapping[str, str] | None = None) -> str | None:
        """The bearer token (read now); `MissingSecret` when the named variable is unset or the file unreadable."""
        source = os.environ if env is None else env
        if self.token_env is not None:
            value = source.get(self.token_env, "").strip()
            if not value:
                raise MissingSecret(f"harness {self.key}: ${self.token_env} (its token_env) is not set")
            return value
        if self.token_file is not None:
            try:
                value = self.token_file.read_text().strip()
            except OSError as exc:
                raise MissingSecret(f"harness {self.key}: cannot read its token_file {self.token_file}: {exc}") from exc
            if not value:
                raise MissingSecret(f"harness {self.key}: its token_file {self.token_file} is empty")
            return value
        return None


@dataclass(frozen=True)
class ModelHarness:
    """A plain OpenAI-compatible model as a harness target: one streamed completion per call, no tools."""

    key: str
    model: ModelSpec
    title: str = ""
    description: str = ""
    system_prompt: str | None = None
    max_output_tokens: int | None = None
    kind: Literal["model"] = "model"


@dataclass(frozen=True)
class ForeignHarness:
    """A foreign loop as a harness target: an external coding-agent CLI (``engine``: claude or codex) run once per
    turn in its own workspace, its permission requests through this harness's gate (`loopd.harness.foreign`)."""

    key: str
    engine: Literal["claude", "codex"]
    title: str = ""
    description: str = ""
    command: tuple[str, ...] = ()
    """The CLI and flags of one's own (model, sandbox, profile); empty: ``claude`` / ``codex`` on PATH."""
    workspace: Path | None = None
    """None: ``<workspaces>/<key>``."""
    policy: GatePolicy | None = None
    policy_path: Path | None = None
    kind: Literal["foreign"] = "foreign"


HarnessTarget = BuiltinHarness | RemoteHarness | ModelHarness | ForeignHarness


@dataclass(frozen=True)
class ActorToken:
    """``auth.actor_tokens[]``: a token made elsewhere (a Secret) that authenticates ``actor`` (``operator:<key>``
    or ``harness:<key>``), read from ``token_env`` or ``token_file`` when the server starts."""

    actor: str
    token_env: str | None = None
    token_file: Path | None = None

    def token(self, env: Mapping[str, str] | None = None) -> str:
        """The token (read now); `MissingSecret` when the variable is unset or the file unreadable or empty."""
        source = os.environ if env is None else env
        if self.token_env is not None:
            value = source.get(self.token_env, "").strip()
            if not value:
                raise MissingSecret(f"auth.actor_tokens: ${self.token_env} (the token of {self.actor}) is not set")
            return value
        assert self.token_file is not None  # the schema requires one of the two
        try:
            value = self.token_file.read_text().strip()
        except OSError as exc:
            raise MissingSecret(f"auth.actor_tokens: cannot read {self.token_file} ({self.actor}): {exc}") from exc
        if not value:
            raise MissingSecret(f"auth.actor_tokens: {self.token_file} (the token of {self.actor}) is empty")
        return value


@dataclass(frozen=True)
class ServerConfig:
    """A configuration file (plus the ``LOOPD_*`` environment overrides) as values; None = not configured."""

    source: str | None = None
    """The file it came from (None: defaults and environment only)."""
    data_dir: Path | None = None
    workspaces: Path | None = None
    host: str | None = None
    port: int | None = None
    api_port: int | None = None
    public: bool | None = None
    database_url: str | None = None
    kube_api: KubeApi = "auto"
    kubeconfig: Path | None = None
    namespace: str | None = None
    """None: the pod's own namespace in-cluster, else ``default`` (`loopd.server.resolve_namespace`)."""
    kube_timeout: float = 10.0
    harness_calls: int | None = None
    task_workers: int = 8
    call_timeout: float | None = None
    lease_ttl: float | None = None
    admin_token: SecretStr | None = field(default=None, repr=False)
    actor_tokens: tuple[ActorToken, ...] = ()
    harnesses: tuple[HarnessTarget, ...] | None = None
    """None: the default harness only (the built-in ``assistant`` on the process's model)."""
    ledger_prompts: bool = True
    """``ledger.prompts``: store every model call's full request and reply in the ledger."""
    ledger_retention: float | None = None
    """``ledger.retention`` in seconds (None: keep prompts and replies for good)."""
    ledger_redact: tuple[str, ...] = ()
    """``ledger.redact``: extra regular expressions redacted before the ledger stores anything."""
