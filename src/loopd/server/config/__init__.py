"""loop-server's configuration file: one YAML file, validated against the committed JSON schema, plus ``LOOPD_*``.

Public face only. `load_config` / `parse_config` read a file into a `ServerConfig` (line-precise `ConfigError`);
`config_from_env` reads the overrides alone; `ENV_OVERRIDES` lists the variables; `config_schema` is the schema
(``schema.json`` in this package). Key-by-key documentation: docs/configuration.md.
Must not do: open anything the configuration describes (the composition root and the command line do).
"""

from loopd.server.config._loader import (
    ADMIN_TOKEN_ENV,
    CONFIG_ENV,
    ENV_OVERRIDES,
    ConfigError,
    ConfigProblem,
    EnvOverride,
    config_from_env,
    config_schema,
    load_config,
    parse_config,
)
from loopd.server.config._types import (
    KUBE_APIS,
    ActorToken,
    BuiltinHarness,
    ForeignHarness,
    HarnessTarget,
    KubeApi,
    MissingSecret,
    ModelHarness,
    ModelSpec,
    RemoteHarness,
    ServerConfig,
)

__all__ = [
    "ADMIN_TOKEN_ENV",
    "CONFIG_ENV",
    "ENV_OVERRIDES",
    "KUBE_APIS",
    "ActorToken",
    "BuiltinHarness",
    "ConfigError",
    "ConfigProblem",
    "EnvOverride",
    "ForeignHarness",
    "HarnessTarget",
    "KubeApi",
    "MissingSecret",
    "ModelHarness",
    "ModelSpec",
    "RemoteHarness",
    "ServerConfig",
    "config_from_env",
    "config_schema",
    "load_config",
    "parse_config",
]
